/* base output files: every file a program writes goes through piper_out, so a full disk is an
 * error naming the file, readers never see half a file, and a device or FIFO given as the output
 * is written, never replaced by a regular file. */
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool io_error(GError **err, const char *path, const char *what, int code) {
  return piper_runtime_error(err, "%s: %s: %s", path, what, strerror(code));
}

/* Where a rename must go for path: a symlink's final target (the link stays a link), path
 * itself for a regular file or a new path; NULL (write in place) for anything else. */
static bool resolve_target(const char *path, char **final, GError **err) {
  struct stat st;
  *final = NULL;
  if (lstat(path, &st) != 0) {
    if (errno != ENOENT)
      return io_error(err, path, "cannot write", errno);
    *final = g_strdup(path);
    return true;
  }
  if (S_ISLNK(st.st_mode)) {
    struct stat target_st;
    if (stat(path, &target_st) == 0) {
      if (!S_ISREG(target_st.st_mode))
        return true; /* a device, FIFO or pipe behind a link (/dev/stdout): in place */
      char *target = realpath(path, NULL);
      if (!target)
        return io_error(err, path, "cannot follow link", errno);
      *final = g_strdup(target);
      free(target);
      return true;
    }
    if (errno != ENOENT)
      return io_error(err, path, "cannot follow link", errno);
    char buf[4096]; /* dangling link: create what it names */
    ssize_t n = readlink(path, buf, sizeof buf - 1);
    if (n < 0)
      return io_error(err, path, "cannot follow link", errno);
    buf[n] = '\0';
    if (buf[0] == '/') {
      *final = g_strdup(buf);
    } else {
      char *dir = g_path_get_dirname(path);
      *final = g_build_filename(dir, buf, NULL);
      g_free(dir);
    }
    return true;
  }
  if (S_ISREG(st.st_mode))
    *final = g_strdup(path);
  return true;
}

/* A new file at tmp, created by this call: O_EXCL|O_NOFOLLOW, so a link planted at tmp is never
 * followed (fopen "w" once wrote through one onto its target). What is already there (a
 * leftover of a killed writer, or a planted link) is unlinked, which removes the name and never
 * touches what a link points to, and creation is tried once more; should something reappear
 * in between, the writer gives up. The name stays fixed (not mkstemp's) so that whoever cleans
 * leftovers (exec/checkpoint.c: rank-<r>.ckpt.tmp) finds them. */
static FILE *open_temporary(const char *tmp) {
  int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = open(tmp, flags, 0666);
  if (fd < 0 && errno == EEXIST && unlink(tmp) == 0)
    fd = open(tmp, flags, 0666);
  if (fd < 0)
    return NULL;
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    int code = errno;
    close(fd);
    unlink(tmp);
    errno = code;
  }
  return f;
}

/* How long a FIFO given as an output may wait for its reader (`cat FIFO` started after the
 * program) before that is an error. */
#define FIFO_READER_WAIT_S 10

/* A device or FIFO, opened to write in place. open(2) of a FIFO blocks until a reader opens it,
 * for ever if none comes, and a signal that only asks the program to stop (SIGINT) restarts
 * the call: so a FIFO is opened with O_NONBLOCK, which fails (ENXIO) while it has no reader,
 * polled for FIFO_READER_WAIT_S, then written blocking as a pipe is. */
static FILE *open_in_place(const char *path, GError **err) {
  int fd = -1;
  for (int tries = 0; fd < 0; tries++) {
    fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 || errno != ENXIO)
      break;
    if (tries >= FIFO_READER_WAIT_S * 20) {
      piper_runtime_error(err, "%s: a FIFO that nobody reads (waited %d s for a reader)", path,
                          FIFO_READER_WAIT_S);
      return NULL;
    }
    g_usleep(G_USEC_PER_SEC / 20);
  }
  if (fd < 0 || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    io_error(err, path, "cannot write", errno);
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  FILE *f = fdopen(fd, "w");
  if (!f) {
    io_error(err, path, "cannot write", errno);
    close(fd);
  }
  return f;
}

bool piper_out_open(struct piper_out *o, const char *path, GError **err) {
  memset(o, 0, sizeof *o);
  o->path = g_strdup(path);
  if (strcmp(path, "-") == 0) {
    o->f = stdout;
    return true;
  }
  if (!resolve_target(path, &o->final, err))
    goto fail;
  if (!o->final) { /* device, FIFO, socket: in place */
    o->f = open_in_place(path, err);
    if (!o->f)
      goto fail;
    return true;
  }
  o->tmp = g_strdup_printf("%s.tmp", o->final);
  o->f = open_temporary(o->tmp);
  if (!o->f) {
    int code = errno;
    g_free(o->tmp);
    o->tmp = NULL; /* not ours: never removed */
    io_error(err, o->final, "cannot create a temporary file next to it", code);
    goto fail;
  }
  return true;
fail:
  piper_out_abandon(o);
  return false;
}

static void release(struct piper_out *o) {
  g_free(o->path);
  g_free(o->final);
  g_free(o->tmp);
  memset(o, 0, sizeof *o);
}

void piper_out_abandon(struct piper_out *o) {
  if (o->f && o->f != stdout)
    fclose(o->f);
  if (o->tmp)
    remove(o->tmp);
  release(o);
}

/* fsync of the directory holding path, so a rename survives a crash. */
static bool sync_dir(const char *path, GError **err) {
  char *dir = g_path_get_dirname(path);
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  bool ok = fd >= 0 && fsync(fd) == 0;
  int code = errno;
  if (fd >= 0)
    close(fd);
  if (!ok)
    io_error(err, dir, "cannot sync directory", code);
  g_free(dir);
  return ok;
}

bool piper_out_close(struct piper_out *o, GError **err) {
  bool ok = !ferror(o->f) && fflush(o->f) == 0;
  int code = errno ? errno : EIO;
  if (ok && o->sync && o->tmp && fsync(fileno(o->f)) != 0) {
    ok = false;
    code = errno;
  }
  if (o->f != stdout && fclose(o->f) != 0 && ok) {
    ok = false;
    code = errno;
  }
  o->f = NULL;
  if (!ok) {
    io_error(err, o->tmp ? o->tmp : o->path, "write failed", code);
  } else if (o->tmp && rename(o->tmp, o->final) != 0) {
    ok = io_error(err, o->path, "cannot rename into place", errno);
  } else if (o->tmp) {
    g_free(o->tmp);
    o->tmp = NULL; /* published: nothing to remove */
    if (o->sync)
      ok = sync_dir(o->final, err);
  }
  if (o->tmp)
    remove(o->tmp);
  release(o);
  return ok;
}

static bool write_file(const char *path, const void *data, size_t len, bool sync, GError **err) {
  struct piper_out o;
  if (!piper_out_open(&o, path, err))
    return false;
  o.sync = sync;
  if (len && fwrite(data, 1, len, o.f) != len) {
    int code = errno ? errno : EIO;
    char *tmp = g_strdup(o.tmp ? o.tmp : o.path);
    piper_out_abandon(&o);
    io_error(err, tmp, "write failed", code);
    g_free(tmp);
    return false;
  }
  return piper_out_close(&o, err);
}

bool piper_write_file(const char *path, const void *data, size_t len, GError **err) {
  return write_file(path, data, len, false, err);
}

bool piper_write_file_durable(const char *path, const void *data, size_t len, GError **err) {
  return write_file(path, data, len, true, err);
}

char *piper_read_file(const char *path, size_t max, size_t *len, GError **err) {
  /* O_NONBLOCK: opening a FIFO without a writer would block before fstat could look at it */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    piper_input_error(err, "%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode))) {
    close(fd);
    piper_input_error(err, "%s: not a regular file", path);
    return NULL;
  }
  /* A pipe (`--directives <(piper-layout ...)`) is read to its end, blocking: its writer holds
   * it open until done. A FIFO nobody writes to reads as empty at once rather than hanging
   * (a read with no writer is end of file). */
  bool pipe = S_ISFIFO(st.st_mode);
  if (pipe && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    close(fd);
    piper_input_error(err, "%s: cannot read: %s", path, strerror(errno));
    return NULL;
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) {
    close(fd);
    piper_input_error(err, "%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  GString *text = NULL;
  if ((uint64_t)st.st_size > max) {
    piper_input_error(err, "%s: file larger than %zu MiB", path, max >> 20);
    goto fail;
  }
  text = g_string_sized_new((gsize)st.st_size + 1);
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
    if (text->len + n > max) { /* grew while we read */
      piper_input_error(err, "%s: file larger than %zu MiB", path, max >> 20);
      goto fail;
    }
    g_string_append_len(text, chunk, (gssize)n);
  }
  if (ferror(f)) {
    piper_input_error(err, "%s: read error: %s", path, strerror(errno));
    goto fail;
  }
  if (pipe && text->len == 0) {
    piper_input_error(err, "%s: a pipe with nothing written to it", path);
    goto fail;
  }
  fclose(f);
  if (len)
    *len = text->len;
  return g_string_free(text, FALSE);
fail:
  fclose(f);
  if (text)
    g_string_free(text, TRUE);
  return NULL;
}
