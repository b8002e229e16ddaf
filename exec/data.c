/* data: training tokens. A token file as llm.c-style trainers write it (1024-byte header of
 * 256 int32: magic 20240520, version, token count; then the tokens, uint16 for version 1 and
 * uint32 for version 2), any other file read as bytes (vocab 256), or a synthetic stream.
 * Sequence block i is read at a fixed place, so a step's data depends only on its number. */
#include <string.h>

#include "../base/json.h"
#include "data.h"

enum data_kind { DATA_SYNTHETIC, DATA_TOKENS16, DATA_TOKENS32, DATA_BYTES };

struct exec_data {
  enum data_kind kind;
  GMappedFile *file;
  const unsigned char *base; /* first token */
  uint32_t *synthetic;
  uint64_t n;
};

#define HEADER_BYTES 1024
#define SYNTHETIC_TOKENS (1u << 16)

static uint32_t token_at(const struct exec_data *d, uint64_t i) {
  switch (d->kind) {
  case DATA_TOKENS16: {
    uint16_t v;
    memcpy(&v, d->base + 2 * i, 2);
    return v;
  }
  case DATA_TOKENS32: {
    uint32_t v;
    memcpy(&v, d->base + 4 * i, 4);
    return v;
  }
  case DATA_BYTES: return d->base[i];
  default: return d->synthetic[i];
  }
}

struct exec_data *exec_data_open(const char *path, int64_t vocab, uint64_t seed, GError **err) {
  struct exec_data *d = g_new0(struct exec_data, 1);
  if (!path) {
    /* 32 symbols (or the vocabulary, if smaller); each is mostly followed by a fixed successor
     * and one time in four by a random symbol: a model first learns the symbol set (loss from
     * ln V to ln 32), then the successors (towards ~1). */
    d->kind = DATA_SYNTHETIC;
    d->n = SYNTHETIC_TOKENS;
    d->synthetic = g_new(uint32_t, d->n);
    uint64_t A = vocab < 32 ? (uint64_t)vocab : 32;
    uint32_t t = (uint32_t)(piper_splitmix64(seed) % A);
    for (uint64_t i = 0; i < d->n; i++) {
      d->synthetic[i] = t;
      uint64_t h = piper_splitmix64(seed ^ (i * 0x2545f4914f6cdd1dull));
      t = (h & 3) ? (uint32_t)(((uint64_t)t * 5 + 3) % A) : (uint32_t)((h >> 8) % A);
    }
    return d;
  }
  GError *io = NULL;
  d->file = g_mapped_file_new(path, FALSE, &io);
  if (!d->file) {
    piper_input_error(err, "%s: cannot read the data file: %s", path, io->message);
    g_error_free(io);
    exec_data_free(d);
    return NULL;
  }
  size_t size = g_mapped_file_get_length(d->file);
  const unsigned char *p = (const unsigned char *)g_mapped_file_get_contents(d->file);
  int32_t hdr[3] = {0, 0, 0};
  if (size)
    memcpy(hdr, p, size < sizeof hdr ? size : sizeof hdr);
  if (hdr[0] == EXEC_DATA_MAGIC && size < HEADER_BYTES) {
    /* a token file cut inside its header: never bytes of text (it once trained on them) */
    piper_input_error(err,
                      "%s: a token file (magic %d) of %zu bytes, cut inside its %d-byte header",
                      path, EXEC_DATA_MAGIC, size, HEADER_BYTES);
    exec_data_free(d);
    return NULL;
  }
  if (size >= HEADER_BYTES && hdr[0] == EXEC_DATA_MAGIC) {
    if (hdr[1] != 1 && hdr[1] != 2) {
      piper_input_error(err, "%s: token file version %d (known: 1 = uint16 tokens, 2 = uint32)",
                        path, hdr[1]);
      exec_data_free(d);
      return NULL;
    }
    size_t width = hdr[1] == 1 ? 2 : 4;
    uint64_t n = (uint32_t)hdr[2];
    if (hdr[2] < 0 || (size - HEADER_BYTES) / width < n) {
      piper_input_error(err, "%s: the header says %d tokens but the file holds %zu", path, hdr[2],
                        (size - HEADER_BYTES) / width);
      exec_data_free(d);
      return NULL;
    }
    d->kind = width == 2 ? DATA_TOKENS16 : DATA_TOKENS32;
    d->base = p + HEADER_BYTES;
    d->n = n;
    for (uint64_t i = 0; i < n; i++) {
      uint32_t t = token_at(d, i);
      if ((int64_t)t >= vocab) {
        piper_input_error(err,
                          "%s: token %u at position %llu is not below the model's vocab_size %lld",
                          path, t, (unsigned long long)i, (long long)vocab);
        exec_data_free(d);
        return NULL;
      }
    }
  } else {
    if (vocab < 256) {
      piper_input_error(err,
                        "%s: read as bytes (no token-file header), which needs vocab_size >= 256 "
                        "(the model has %lld)",
                        path, (long long)vocab);
      exec_data_free(d);
      return NULL;
    }
    d->kind = DATA_BYTES;
    d->base = p;
    d->n = size;
  }
  if (d->n < 2) {
    piper_input_error(err, "%s: %llu tokens are too few to train on", path,
                      (unsigned long long)d->n);
    exec_data_free(d);
    return NULL;
  }
  return d;
}

void exec_data_free(struct exec_data *d) {
  if (!d)
    return;
  if (d->file)
    g_mapped_file_unref(d->file);
  g_free(d->synthetic);
  g_free(d);
}

uint64_t exec_data_tokens(const struct exec_data *d) {
  return d->n;
}

const char *exec_data_kind(const struct exec_data *d) {
  switch (d->kind) {
  case DATA_TOKENS16:
  case DATA_TOKENS32: return "tokens";
  case DATA_BYTES: return "bytes";
  default: return "synthetic";
  }
}

void exec_data_batch(const struct exec_data *d, uint64_t index, int batch, int seq, int32_t *tokens,
                     int32_t *targets) {
  /* sequences of seq + 1 tokens, laid end to end (seq apart) and wrapping around the data;
   * a stream shorter than one sequence repeats itself */
  uint64_t span = d->n > (uint64_t)seq + 1 ? d->n - (uint64_t)seq - 1 : 1;
  for (int b = 0; b < batch; b++) {
    uint64_t q = index * (uint64_t)batch + (uint64_t)b;
    uint64_t start = (q * (uint64_t)seq) % span;
    for (int t = 0; t < seq; t++) {
      tokens[(size_t)b * seq + t] = (int32_t)token_at(d, (start + (uint64_t)t) % d->n);
      targets[(size_t)b * seq + t] = (int32_t)token_at(d, (start + (uint64_t)t + 1) % d->n);
    }
  }
}
