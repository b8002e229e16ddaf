/* data: the training data. A token file (llm.c layout: 256 int32 header, magic 20240520, version 1,
 * token count, then uint16 tokens), any other file as bytes (vocab 256), or, with path NULL, a
 * deterministic synthetic stream with learnable structure.
 *
 *   GError *err = NULL;
 *   int32_t tokens[2 * 64], targets[2 * 64];
 *   struct exec_data *d = exec_data_open(NULL, 256, 1234, &err); // synthetic, vocabulary 256
 *   exec_data_batch(d, 0, 2, 64, tokens, targets); // sequence block 0: 2 sequences of 64
 *   exec_data_free(d);
 */
#ifndef PIPER_EXEC_DATA_H
#define PIPER_EXEC_DATA_H

#include <glib.h>
#include <stdint.h>

#define EXEC_DATA_MAGIC 20240520
struct exec_data;
struct exec_data *exec_data_open(const char *path, int64_t vocab, uint64_t seed, GError **err);
void exec_data_free(struct exec_data *d);
uint64_t exec_data_tokens(const struct exec_data *d);
const char *exec_data_kind(const struct exec_data *d); /* "tokens", "bytes", "synthetic" */
/* Fills tokens and targets ([batch * seq] each) of sequence block `index`: batch consecutive
 * sequences of seq + 1 tokens (targets are the inputs shifted by one). */
void exec_data_batch(const struct exec_data *d, uint64_t index, int batch, int seq, int32_t *tokens,
                     int32_t *targets);

#endif
