/* plan: per-device plans lowered from the rewritten IR (docs/design.md, "The plan contract"). Each
 * device runs, per logical stream, an ordered list of instructions, with event waits on other
 * streams, communicators per purpose with sequence numbers, and tensors with sizes, producers and
 * consumers. Devices that belong to the same device groups run the same program up to rank ids, so
 * they share one program ("class"); peers and communicator ranks are resolved per device from the
 * groups. Plans are self-contained: they carry the model config, nodes, groups and streams.
 *
 *   GError *err = NULL;
 *   const struct ir_graph *graph = NULL;              // rewritten by dir_program_apply
 *   struct plan *p = plan_lower(graph, NULL, &err);   // also runs plan_check_progress
 *   uint32_t device = 0;
 *   const struct plan_class *c = plan_device_class(p, device);
 *   for (uint32_t i = 0; i < c->n_instrs; i++)
 *     printf("%u on stream %u\n", c->instrs[i].node, c->instrs[i].stream);
 *   int rank = plan_group_position(p, p->nodes[c->instrs[0].node].group, device);
 *   struct plan_memory_event *ev = NULL;            // the memory rule, as an arena meets it
 *   uint32_t n_ev = plan_class_memory_events(c, &ev);
 *   for (uint32_t k = 0; k < n_ev; k++)
 *     printf("%s tensor %u at instruction %u\n", ev[k].release ? "free" : "alloc", ev[k].tensor,
 *            ev[k].instr);
 *   g_free(ev);
 *   plan_write_dir(p, "out/plan", &err);
 *   plan_free(p);
 */
#ifndef PIPER_IR_PLAN_H
#define PIPER_IR_PLAN_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "../models/model.h"
#include "ir.h"

struct plan_instr {
  uint32_t node;                   /* index into plan.nodes (the IR node it runs) */
  uint32_t stream;                 /* index into plan.streams */
  uint32_t comm;                   /* communicator (plan.comms), IR_NONE for compute / optimizer */
  uint32_t seq;                    /* position among this device's instructions on comm */
  uint32_t wait_first, wait_count; /* class.waits: instructions on other streams to wait for */
  uint32_t read_first, read_count; /* class.reads: tensors consumed */
  uint32_t write_first, write_count; /* class.writes: tensors produced */
  /* 0: issued alone. n >= 2: one of the n sends and receives of a point-to-point group, issued
   * together (ncclGroupStart/End; MPI Isend/Irecv then one wait). The parts are consecutive in
   * their stream's list; the group is posted when every part's waits are done, each part meets
   * its peer on its own, and the group completes (for its stream and for whatever waits on a
   * part) when the last part has met its peer. Lowering forms groups only on a stream that
   * carries more than one kind of point-to-point traffic (a named stream). */
  uint32_t group_parts;
};

/* A buffer a device holds for one step: activations sent on, activations saved for backward,
 * gradients, received data, gathered parameters.
 *
 * The memory rule (one for the simulator and every backend's allocator): a tensor is allocated
 * when its alloc instruction starts and released when its release instruction has ended (and,
 * should a consumer on another stream still run then, when the last consumer ends). Lowering
 * sets alloc to the producer (a kernel writes its output, a receive its buffer, while it runs)
 * and release to the last consumer in issue order; a later pass (a ZeRO-3 prefetch, an arena
 * planner) may allocate earlier, never later than the producer. plan_class_memory_events
 * lists the points in the order an arena meets them. */
/* OUT: read by other instructions (a segment's output, a gradient, a received or gathered
 * buffer); SAVED: F's activations for its backward, or what BI keeps for BW; WORK: what a
 * compute instruction holds only while it runs (alloc = release = producer, no consumers). */
enum plan_tensor_kind { PLAN_TENSOR_OUT, PLAN_TENSOR_SAVED, PLAN_TENSOR_WORK };
struct plan_tensor {
  uint64_t bytes;    /* on one device */
  uint32_t producer; /* class instruction index */
  enum plan_tensor_kind kind;
  uint32_t consumer_first, consumer_count; /* class.consumers */
  uint32_t alloc;   /* allocated at this instruction's start: <= producer */
  uint32_t release; /* released at this instruction's end: the last consumer in issue order */
};

/* The program of every device with the same group memberships. instrs are in issue order
 * (a topological order of the whole step); a stream's list is its subsequence. */
struct plan_class {
  uint32_t n_devices;
  uint32_t *devices; /* members, ascending */
  uint32_t n_instrs;
  struct plan_instr *instrs;
  uint32_t *stream_first; /* [n_streams + 1]: stream s runs stream_instrs[first[s] .. first[s+1]) */
  uint32_t *stream_instrs; /* instruction indices grouped by stream, in issue order */
  uint32_t n_waits, n_reads, n_writes, n_consumers;
  uint32_t *waits, *reads, *writes, *consumers;
  uint32_t n_tensors;
  struct plan_tensor *tensors;
};

/* DP and EP: the members of group (rank = position). PP: for each position p the pair
 * {group[p], peer_group[p]}, group sending to peer_group (one communicator per direction).
 * split > 1 (tensor parallelism, TP innermost in the group): the group holds several instances;
 * TP: positions [p - p mod split, +split), a device's TP peers; DP and EP: the positions with
 * p's TP rank, {p mod split + k split}. 0 = one instance of the whole group. */
struct plan_comm {
  enum ir_comm_purpose purpose;
  uint32_t group;
  uint32_t peer_group; /* PP only, else IR_NONE */
  uint32_t split;
  /* EP carved from the stage (ir_node.expert_replicas): an instance holds only the positions
   * of p's block [p - p mod block, +block), with p's TP rank when split > 1; 0 = the whole
   * group. */
  uint32_t block;
  /* cp only: the TP degree (0 or 1: none). A cp communicator's instance is the split = cp
   * devices of one tp rank and one dp rank: positions base + k * stride (Megatron's order, TP
   * innermost, then CP; plan_comm_instance). */
  uint32_t stride;
};

/* Where each device sits in the groups it belongs to, so that peers and ranks are found
 * without scanning groups. Derived from groups and device_pool (plan_index_positions, run by
 * plan_lower and the reader; never written to the files). Device d's memberships are entries
 * [first[d], first[d + 1]) of group (ascending) and rank (d's position in that group): one
 * entry per device_pool slot, so the table is linear in the devices' memberships. */
struct plan_positions {
  uint32_t *first; /* [n_devices + 1] */
  uint32_t *group;
  uint32_t *rank;
};

struct plan {
  struct model *model; /* owned, rebuilt from model_json */
  char *model_json;    /* model_to_json text */
  char *program_json;  /* the directive program compiled (text), may be NULL */
  uint32_t n_devices;
  uint32_t n_microbatches;
  uint32_t n_tags;
  char tag_names[IR_MAX_TAGS][MODEL_TAG_NAME_MAX];
  uint32_t n_nodes;
  struct ir_node *nodes;
  uint32_t n_groups;
  struct ir_group *groups;
  uint32_t n_device_pool;
  uint32_t *device_pool;
  uint32_t n_segsets;
  struct ir_segset *segsets;
  uint32_t n_segment_pool;
  uint32_t *segment_pool;
  uint32_t n_streams;
  struct ir_stream *streams;
  uint32_t n_comms;
  struct plan_comm *comms;
  uint32_t n_classes;
  struct plan_class *classes;
  uint32_t *device_class; /* [n_devices] */
  struct plan_positions positions;
};

/* Lowers a rewritten graph and runs the progress check. The graph's model is copied. */
struct plan *plan_lower(const struct ir_graph *g, const char *program_json, GError **err);
void plan_free(struct plan *p);

/* Unit-time dry run of all devices: every instruction takes one step once its stream is free
 * and its waits are done; sends meet recvs and collectives start when all members are at them
 * with equal sequence numbers; a point-to-point group posts all its parts at once. Fails (PIPER_ERROR_INPUT) naming the devices and instructions
 * that wait on each other. */
bool plan_check_progress(const struct plan *p, GError **err);

/* Plans of more devices than this are written one file per class (class-<k>.json, the program
 * of the class's first member) instead of one per device: past a thousand devices nobody reads
 * device files one by one, and a file per device would repeat its class's program (about 90 KB
 * for a 70B stage) a hundred thousand times. At this size and below the per-device layout, the
 * one people grep, stays as it was. plan.json says "layout": "classes" for the compact one. */
#define PLAN_DEVICE_FILES_MAX 2048u
/* Serialisation: dir/plan.json (index) and dir/device-<d>.json per device, or past 2,048
 * devices dir/class-<k>.json per class (plan.json then says "layout": "classes"). The reader
 * takes either. */
bool plan_write_dir(const struct plan *p, const char *dir, GError **err);
struct plan *plan_read_dir(const char *dir, GError **err);
bool plan_equal(const struct plan *a, const struct plan *b);
/* The reader behind plan_read_dir, on documents already parsed (for the fuzzer and for callers
 * that hold the files in memory): index is plan.json, device_docs[d] is device-<d>.json, and
 * n_docs must equal the index's n_devices (in the "classes" layout: device_docs[k] is
 * class-<k>.json and n_docs the number of classes). name stands for the directory in messages. Validates
 * everything and runs plan_check_progress, like plan_read_dir. */
struct plan *plan_from_json(const char *name, const cJSON *index, const cJSON *const *device_docs,
                            uint32_t n_docs, GError **err);

/* (Re)builds p->positions from the groups; needed by every view below. A plan built by hand
 * calls it once its groups and device pool are final. */
void plan_index_positions(struct plan *p);

/* Per-device views. */
const struct plan_class *plan_device_class(const struct plan *p, uint32_t device);
/* Rank of device in group (its first position there), or -1. O(log of its memberships). */
int plan_group_position(const struct plan *p, uint32_t group, uint32_t device);
/* Rank of device in the node's group, or -1. */
int plan_node_position(const struct plan *p, uint32_t node, uint32_t device);
/* The device a send/recv of `device` talks to. */
uint32_t plan_peer(const struct plan *p, uint32_t node, uint32_t device);
/* Size of the communicator instance device is in (2 for PP), its rank in it, and its members
 * (members may be NULL; else room for the size). */
uint32_t plan_comm_size(const struct plan *p, uint32_t comm);
/* The instance of split communicator c (split > 1, not PP) that holds group position pos: its
 * members are the positions first + k * *stride for k < plan_comm_size, pos being the *rank-th.
 * Returns first, which names the instance. TP: split consecutive positions; DP / EP: the
 * positions of pos's TP rank (stride split); CP: pos's TP and DP rank (stride the TP degree). */
uint32_t plan_comm_instance(const struct plan_comm *c, uint32_t pos, uint32_t *stride,
                            uint32_t *rank);
int plan_comm_rank(const struct plan *p, uint32_t comm, uint32_t device);
void plan_comm_members(const struct plan *p, uint32_t comm, uint32_t device, uint32_t *members);
/* e.g. "pp g1->g2", "dp g0", "ep g0" */
void plan_comm_name(const struct plan *p, uint32_t comm, char *buf, size_t len);
void plan_node_name(const struct plan *p, uint32_t node, char *buf, size_t len);
/* How many entries of c->stream_instrs, from entry on, are issued together: the parts of the
 * point-to-point group whose first part is at entry, or 1 for an instruction issued alone. */
uint32_t plan_group_span(const struct plan_class *c, uint32_t entry);
/* Where the point-to-point groups of c are, for views that show a group as one box: a table
 * from every grouped part's node to the stream_instrs entry of its group's first part, plus one
 * (GUINT_TO_POINTER); NULL when c has no group. Free with g_hash_table_destroy. */
GHashTable *plan_class_group_index(const struct plan_class *c);
/* The group whose first part is at stream_instrs entry `entry` of device's class, named by its
 * parts: "group: send F s1 MB=3 ->g2 + recv B s1 MB=1 <-g2" (long form) or "sF3 rB1" (short,
 * pass and micro-batch tag value mb_tag, -1 for none). */
void plan_group_name(const struct plan *p, const struct plan_class *c, uint32_t entry,
                     bool short_form, int mb_tag, char *buf, size_t len);
/* The stream on which communication of more than one purpose (pipeline, data-parallel,
 * expert) takes turns on some device, the one with the most such bytes a step (*bytes, on
 * *device); false when no stream mixes purposes. Point-to-point traffic alone is not counted:
 * lowering groups it. */
bool plan_mixed_stream(const struct plan *p, uint32_t *stream, uint32_t *device, uint64_t *bytes);
/* One point of the memory rule: tensor is allocated at the start (release false) or released
 * at the end (release true) of class instruction instr. */
struct plan_memory_event {
  uint32_t instr;
  uint32_t tensor;
  bool release;
};
/* The memory points of class c in the order an arena meets them running the class's
 * instructions in issue order: per instruction, the tensors it allocates (at its start, by
 * tensor id), then those it releases (at its end, by tensor id). Returns their number (twice
 * the tensors); *events is the caller's (g_free). Tensors of 0 bytes are listed too. */
uint32_t plan_class_memory_events(const struct plan_class *c, struct plan_memory_event **events);

/* Counts for --stats and plan.json: instructions over all devices (class size times members). */
uint64_t plan_instruction_count(const struct plan *p);

#endif
