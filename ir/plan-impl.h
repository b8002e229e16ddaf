/* plan-impl: what plan.c (views, equality), plan_write.c and plan_read.c (the files) share.
 * Private to ir/. The file format's constants live here so the writer and the reader cannot
 * disagree on them. */
#ifndef PIPER_IR_PLAN_IMPL_H
#define PIPER_IR_PLAN_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "plan.h"

#define PLAN_FORMAT "piper-plan"
#define PLAN_DEVICE_FORMAT "piper-plan-device"
#define PLAN_VERSION 1
#define PLAN_LAYOUT_CLASSES "classes"
/* Bounds on what a plan file may declare. Counts are also bounded by the file size (64 MiB), so
 * these mainly keep arithmetic in 32 bits. */
#define PLAN_MAX_COUNT (1u << 24)
#define PLAN_MAX_STREAMS 1024u
#define PLAN_MAX_MICROBATCHES (1u << 20)
#define PLAN_MAX_DIRECTIVE (1u << 24)
/* Byte counts travel as JSON numbers (doubles), exact up to 2^53. */
#define PLAN_MAX_BYTES (UINT64_C(1) << 53)
#define PLAN_NAME_LEN 256

/* Names of enum ir_comm_purpose values in the files, by value. */
extern const char *const plan_purpose_names[IR_COMM_PURPOSE_COUNT];

/* The reader's check that the embedded model agrees with the nodes (plan_model.c): segments,
 * parameter bytes of segment sets, bytes of communication. file names plan.json in messages. */
bool plan_check_model(const struct plan *p, const char *file, GError **err);

/* What lowering gives compute node n as its "work" tensor (0: none): the bytes it holds only
 * while it runs, from the model's shapes (sequence length, micro-batch size, hidden sizes). */
uint64_t plan_compute_work_bytes(const struct model *m, const struct ir_node *n);
/* The reader's checks once every device is read (plan_model.c): n_microbatches against the
 * split tags the nodes carry, and each compute instruction's "work" tensor against the model. */
bool plan_check_instructions(const struct plan *p, const char *file, GError **err);

/* Frees a class's arrays and zeroes it. */
void plan_class_clear(struct plan_class *c);
/* True when the two programs are equal; else writes what differs into what (the reader says
 * where two members of a class disagree). */
bool plan_class_diff(const struct plan_class *a, const struct plan_class *b, uint32_t n_streams,
                     char *what, size_t len);

/* Which end of its communicator an instruction is: a recv receives, everything else is on the
 * sending side (or on a collective, where sides do not exist). Sequence numbers count per end,
 * as lowering does, because a device on both ends of a PP communicator sends and receives. */
static inline int plan_comm_side(const struct ir_node *n) {
  return n->kind == IR_NODE_RECV;
}

/* Device d's peer on send/recv node n, or IR_NONE. */
uint32_t plan_device_peer(const struct plan *p, uint32_t d, const struct ir_node *n);
/* Device d's rank on comm, or -1; for PP also the pair (sender, receiver). side picks the end
 * of a PP communicator: 0 the sender, 1 the receiver, -1 whichever the device is (the sender
 * if both, as plan_comm_rank does). */
int32_t plan_device_comm_rank(const struct plan *p, uint32_t d, uint32_t comm, int side,
                              uint32_t pair[2]);
/* The communicators a class uses, ascending, without repeats; *n_out gets their count. */
uint32_t *plan_class_comms(const struct plan_class *c, uint32_t *n_out);

/* A fixed-size name field as a C string (the field may fill its array without a NUL). */
static inline void plan_copy_name(char *dst, const char *src, size_t max) {
  size_t n = strnlen(src, max);
  memcpy(dst, src, n);
  dst[n] = '\0';
}

#endif
