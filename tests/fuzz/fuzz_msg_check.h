/*
 * Checks shared by the targets that decode messages (fuzz_frame.c, fuzz_msg.c): what a
 * message that ts_msg_decode accepted must satisfy beyond "no crash, no leak".
 */
#ifndef TS_FUZZ_MSG_CHECK_H
#define TS_FUZZ_MSG_CHECK_H

#include <protobuf-c/protobuf-c.h>
#include <stdint.h>

#include "fuzz_target.h"

/* m, which ts_msg_decode(type, ..., data_len) returned, is of type's message; a Push or
 * PullReply describes exactly data_len payload bytes; and m re-encodes to a frame whose
 * header decodes to (type, data_len) and whose meta decodes to a message that packs to the
 * same bytes. data_len must be 0 for the types that carry no payload. */
void fuzz_check_decoded(const char *target, uint16_t type, const ProtobufCMessage *m,
                        uint64_t data_len);

#endif
