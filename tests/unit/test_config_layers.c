/*
 * A job file's layer list (config/ts_config_layers.h): LeNet-5 as a person writes it, and
 * each mistake refused with the file, the line of the layer, its index and type, and what is
 * wrong.
 */
#include <libconfig.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ts_config_layers.h"
#include "ts_err.h"

static ts_config_layer_t layers[TS_CONFIG_LAYERS_MAX];

/* Parse text's model.layers; returns the parser's code, the error in err. */
static int parse(const char *text, size_t *n, char *err, size_t errlen) {
  config_t c;
  config_init(&c);
  if (config_read_string(&c, text) != CONFIG_TRUE)
    fail_msg("libconfig: line %d: %s", config_error_line(&c), config_error_text(&c));
  const config_setting_t *l = config_lookup(&c, "model.layers");
  assert_non_null(l);
  err[0] = '\0';
  int rc = ts_config_layers_parse(l, "job.cfg", layers, TS_CONFIG_LAYERS_MAX, n, err, errlen);
  config_destroy(&c);
  return rc;
}

static void test_lenet5(void **state) {
  (void)state;
  const char *text =
      "model = {\n"
      "  layers = (\n"
      "    { type = \"conv2d\"; filters = 6; kernel = 5; padding = \"same\"; activation = "
      "\"relu\"; },\n"
      "    { type = \"max_pool\"; size = 2; },\n"
      "    { type = \"conv2d\"; filters = 16; kernel = [5, 3]; strides = [1, 2]; activation = "
      "\"relu\"; },\n"
      "    { type = \"max_pool\"; size = 2; strides = 2; padding = \"valid\"; },\n"
      "    { type = \"flatten\"; },\n"
      "    { type = \"dense\"; units = 120; activation = \"tanh\"; },\n"
      "    { type = \"dropout\"; rate = 0.5; },\n"
      "    { type = \"dense\"; units = 10; name = \"logits\"; }\n"
      "  );\n"
      "};\n";
  size_t n = 0;
  char err[256];
  assert_int_equal(parse(text, &n, err, sizeof err), 0);
  assert_int_equal(n, 8);
  assert_string_equal(layers[0].type, "conv2d");
  assert_int_equal(layers[0].filters, 6);
  assert_int_equal(layers[0].kernel[0], 5);
  assert_int_equal(layers[0].kernel[1], 5);
  assert_string_equal(layers[0].padding, "same");
  assert_string_equal(layers[0].activation, "relu");
  assert_string_equal(layers[0].where, "job.cfg:3");
  assert_int_equal(layers[1].kernel[0], 2);
  assert_int_equal(layers[1].strides[0], 0); /* not given: the model's default */
  assert_string_equal(layers[1].padding, "");
  assert_int_equal(layers[2].kernel[1], 3);
  assert_int_equal(layers[2].strides[1], 2);
  assert_int_equal(layers[3].strides[0], 2);
  assert_string_equal(layers[4].type, "flatten");
  assert_int_equal(layers[5].units, 120);
  assert_true(layers[6].rate == 0.5);
  assert_string_equal(layers[7].name, "logits");
  assert_string_equal(layers[7].activation, "");
  assert_string_equal(layers[7].where, "job.cfg:10");
}

static void expect(const char *layer_lines, const char *want) {
  char text[1024], err[256];
  snprintf(text, sizeof text, "model = {\n  layers = (\n%s\n  );\n};\n", layer_lines);
  size_t n = 99;
  assert_int_equal(parse(text, &n, err, sizeof err), TS_ECONFIG);
  if (!strstr(err, want)) fail_msg("error '%s' does not contain '%s'", err, want);
  assert_int_equal(n, 0);
}

static void test_mistakes(void **state) {
  (void)state;
  expect("{ type = \"dense\"; units = 10; },\n{ type = \"conv3d\"; }",
         "job.cfg:4: model.layers: layer 2: unknown type \"conv3d\" (conv2d, max_pool");
  expect("{ units = 10; }", "job.cfg:3: model.layers: layer 1: no type");
  expect("{ type = \"conv2d\"; filter = 6; kernel = 5; }",
         "job.cfg:3: model.layers: layer 1 (conv2d): unknown key 'filter': conv2d takes name, "
         "filters, kernel, strides, padding, activation");
  expect("{ type = \"conv2d\"; filters = 6; }", "layer 1 (conv2d): missing 'kernel' (conv2d takes");
  expect("{ type = \"max_pool\"; size = 2; activation = \"relu\"; }",
         "layer 1 (max_pool): unknown key 'activation': max_pool takes name, size, strides, "
         "padding");
  expect("{ type = \"conv2d\"; filters = 6; kernel = [5, 5, 5]; }",
         "layer 1 (conv2d): kernel must be an integer or a list of two integers [h, w]");
  expect("{ type = \"conv2d\"; filters = 0; kernel = 5; }",
         "layer 1 (conv2d): filters = 0 outside 1..65536");
  expect("{ type = \"conv2d\"; filters = 6; kernel = \"5\"; }",
         "layer 1 (conv2d): kernel must be an integer");
  expect("{ type = \"conv2d\"; filters = 6; kernel = 5; padding = \"SAME\"; }",
         "layer 1 (conv2d): padding \"SAME\" must be \"valid\" or \"same\"");
  expect("{ type = \"dense\"; units = 10; activation = \"sigmoid\"; }",
         "layer 1 (dense): activation \"sigmoid\" must be \"linear\" or \"relu\" or \"tanh\"");
  expect("{ type = \"dropout\"; rate = 1.0; }", "layer 1 (dropout): rate = 1 outside [0, 1)");
  expect("{ type = \"dropout\"; rate = \"half\"; }", "layer 1 (dropout): rate must be a number");
  expect("{ type = \"dense\"; units = 10; name = \"a/b\"; }",
         "layer 1 (dense): name \"a/b\" may not contain '/'");
  expect("{ type = \"dense\"; units = 2000000; }", "units = 2000000 outside 1..1048576");
  expect("\"dense\"", "model.layers: layer 1: must be a group");

  char err[256];
  size_t n;
  /* not a list, an empty list */
  assert_int_equal(parse("model = { layers = [784, 10]; };\n", &n, err, sizeof err), TS_ECONFIG);
  assert_non_null(strstr(err, "job.cfg:1: model.layers: must be a list of layers"));
  assert_int_equal(parse("model = { layers = (); };\n", &n, err, sizeof err), TS_ECONFIG);
  assert_non_null(strstr(err, "0 layers, outside 1..64"));
}

/* Embedding layers (data.format "criteo"): one field or a list, and their mistakes. */
static void test_embedding(void **state) {
  (void)state;
  const char *text =
      "model = { layers = (\n"
      "  { type = \"embedding\"; table = \"ads\"; dim = 8; field = 3; },\n"
      "  { type = \"embedding\"; table = \"all\"; dim = 16; field = [1, 2, 26]; },\n"
      "  { type = \"dense\"; units = 2; }\n"
      "); };\n";
  size_t n = 0;
  char err[256];
  assert_int_equal(parse(text, &n, err, sizeof err), 0);
  assert_int_equal(n, 3);
  assert_string_equal(layers[0].type, "embedding");
  assert_string_equal(layers[0].table, "ads");
  assert_int_equal(layers[0].dim, 8);
  assert_int_equal(layers[0].num_fields, 1);
  assert_int_equal(layers[0].fields[0], 3);
  assert_string_equal(layers[1].table, "all");
  assert_int_equal(layers[1].num_fields, 3);
  assert_int_equal(layers[1].fields[2], 26);
  expect("{ type = \"embedding\"; table = \"t\"; dim = 8; }",
         "layer 1 (embedding): missing 'field' (embedding takes table, dim, field)");
  expect("{ type = \"embedding\"; table = \"t\"; dim = 8; field = 27; }",
         "layer 1 (embedding): field = 27 outside 1..26");
  expect("{ type = \"embedding\"; table = \"t\"; dim = 0; field = 1; }",
         "layer 1 (embedding): dim = 0 outside 1..4096");
  expect("{ type = \"embedding\"; table = \"\"; dim = 4; field = 1; }",
         "layer 1 (embedding): table must be a non-empty string");
  expect("{ type = \"embedding\"; table = \"t\"; dim = 4; field = []; }",
         "layer 1 (embedding): field must be a field number or a list of 1..26 of them");
  expect("{ type = \"embedding\"; table = \"t\"; dim = 4; field = 1; units = 3; }",
         "unknown key 'units': embedding takes table, dim, field");
  expect("{ type = \"dot\"; units = 3; }", "layer 1 (dot): unknown key 'units': dot takes no keys");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embedding),
      cmocka_unit_test(test_lenet5),
      cmocka_unit_test(test_mistakes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
