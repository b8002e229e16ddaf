/* Tests of the base layer: one-line input errors, quoting, the output writer (regular files,
 * symlinks, devices, FIFOs, a full device), hashing, comparators and the number parsers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../base/base.h"
#include "../../base/json.h"

static char *temp_dir(void) {
  GError *err = NULL;
  char *dir = g_dir_make_tmp("piper-base-XXXXXX", &err);
  assert_non_null(dir);
  return dir;
}

static char *slurp(const char *path) {
  char *text = NULL;
  assert_true(g_file_get_contents(path, &text, NULL, NULL));
  return text;
}

static void test_input_error_is_one_line(void **state) {
  (void)state;
  GError *err = NULL;
  assert_false(piper_input_error(&err, "%s: key \"%s\" is bad", "m.json", "a\nb\tc"));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_string_equal(err->message, "m.json: key \"a\\x0ab\\x09c\" is bad");
  /* the first error stays */
  assert_false(piper_runtime_error(&err, "later"));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  g_error_free(err);
  err = NULL;
  assert_false(piper_runtime_error(&err, "disk %d", 1));
  assert_int_equal(err->code, PIPER_ERROR_RUNTIME);
  g_error_free(err);
  assert_false(piper_input_error(NULL, "no error wanted"));
}

static void test_quote(void **state) {
  (void)state;
  char *q = piper_quote("a\"b\\c\x01", 6, 100);
  assert_string_equal(q, "\"a\\\"b\\\\c\\x01\"");
  g_free(q);
  q = piper_quote("abcdef", 6, 3);
  assert_string_equal(q, "\"abc\"...");
  g_free(q);
}

static void test_write_regular_and_new(void **state) {
  (void)state;
  char *dir = temp_dir();
  char *path = g_build_filename(dir, "x.txt", NULL);
  GError *err = NULL;
  assert_true(piper_write_file(path, "one\n", 4, &err));
  char *text = slurp(path);
  assert_string_equal(text, "one\n");
  g_free(text);
  assert_true(piper_write_file_durable(path, "two\n", 4, &err));
  text = slurp(path);
  assert_string_equal(text, "two\n");
  g_free(text);
  char *tmp = g_strdup_printf("%s.tmp", path);
  assert_false(g_file_test(tmp, G_FILE_TEST_EXISTS));
  /* a directory that does not exist is a runtime error naming the file */
  char *bad = g_build_filename(dir, "no", "such", "y.txt", NULL);
  assert_false(piper_write_file(bad, "x", 1, &err));
  assert_int_equal(err->code, PIPER_ERROR_RUNTIME);
  assert_non_null(strstr(err->message, "y.txt"));
  g_clear_error(&err);
  remove(path);
  rmdir(dir);
  g_free(bad);
  g_free(tmp);
  g_free(path);
  g_free(dir);
}

static void test_symlink_is_followed(void **state) {
  (void)state;
  char *dir = temp_dir();
  char *target = g_build_filename(dir, "target.txt", NULL);
  char *link = g_build_filename(dir, "link.txt", NULL);
  GError *err = NULL;
  assert_true(piper_write_file(target, "old", 3, &err));
  assert_int_equal(symlink("target.txt", link), 0);
  assert_true(piper_write_file(link, "new", 3, &err));
  struct stat st;
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  char *text = slurp(target);
  assert_string_equal(text, "new");
  g_free(text);
  /* a dangling link creates what it names */
  remove(target);
  assert_true(piper_write_file(link, "again", 5, &err));
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  text = slurp(target);
  assert_string_equal(text, "again");
  g_free(text);
  remove(link);
  remove(target);
  rmdir(dir);
  g_free(link);
  g_free(target);
  g_free(dir);
}

/* A link planted at the temporary name (<file>.tmp) is never written through: its target keeps
 * its bytes, the file gets them, and the link is gone (fopen "w" once followed it). So is a
 * leftover temporary file of a killed writer. */
static void test_planted_temporary_link(void **state) {
  (void)state;
  char *dir = temp_dir();
  char *victim = g_build_filename(dir, "victim.txt", NULL);
  char *path = g_build_filename(dir, "results.csv", NULL);
  char *tmp = g_strdup_printf("%s.tmp", path);
  GError *err = NULL;
  assert_true(piper_write_file(victim, "keep", 4, &err));
  assert_int_equal(symlink("victim.txt", tmp), 0);
  assert_true(piper_write_file(path, "data", 4, &err));
  char *text = slurp(victim);
  assert_string_equal(text, "keep");
  g_free(text);
  text = slurp(path);
  assert_string_equal(text, "data");
  g_free(text);
  struct stat st;
  assert_int_not_equal(lstat(tmp, &st), 0);
  /* a stale temporary file from a writer killed before its rename */
  assert_true(piper_write_file(victim, "stale", 5, &err));
  assert_int_equal(rename(victim, tmp), 0);
  assert_true(piper_write_file_durable(path, "next", 4, &err));
  text = slurp(path);
  assert_string_equal(text, "next");
  g_free(text);
  assert_int_not_equal(lstat(tmp, &st), 0);
  remove(path);
  rmdir(dir);
  g_free(tmp);
  g_free(path);
  g_free(victim);
  g_free(dir);
}

static void test_devices_written_in_place(void **state) {
  (void)state;
  GError *err = NULL;
  assert_true(piper_write_file("/dev/null", "x", 1, &err));
  struct stat st;
  assert_int_equal(stat("/dev/null", &st), 0);
  assert_true(S_ISCHR(st.st_mode));
  /* a full device is a write error naming it, and stays a device */
  if (access("/dev/full", W_OK) == 0) {
    assert_false(piper_write_file("/dev/full", "x", 1, &err));
    assert_int_equal(err->code, PIPER_ERROR_RUNTIME);
    assert_non_null(strstr(err->message, "/dev/full"));
    g_clear_error(&err);
    assert_int_equal(stat("/dev/full", &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    struct piper_out out;
    assert_true(piper_out_open(&out, "/dev/full", &err));
    for (int i = 0; i < 100000; i++)
      fputs("0123456789", out.f);
    assert_false(piper_out_close(&out, &err));
    assert_non_null(strstr(err->message, "No space left on device"));
    g_clear_error(&err);
  }
}

static void test_fifo_written_in_place(void **state) {
  (void)state;
  char *dir = temp_dir();
  char *fifo = g_build_filename(dir, "pipe", NULL);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) { /* reader: exits 0 when it got exactly the bytes */
    int fd = open(fifo, O_RDONLY);
    char buf[16] = {0};
    ssize_t n = read(fd, buf, sizeof buf - 1);
    _exit(n == 5 && strcmp(buf, "hello") == 0 ? 0 : 1);
  }
  GError *err = NULL;
  assert_true(piper_write_file(fifo, "hello", 5, &err));
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  struct stat st;
  assert_int_equal(lstat(fifo, &st), 0);
  assert_true(S_ISFIFO(st.st_mode));
  remove(fifo);
  rmdir(dir);
  g_free(fifo);
  g_free(dir);
}

static void test_abandon_leaves_nothing(void **state) {
  (void)state;
  char *dir = temp_dir();
  char *path = g_build_filename(dir, "half.txt", NULL);
  GError *err = NULL;
  struct piper_out out;
  assert_true(piper_out_open(&out, path, &err));
  fputs("half", out.f);
  piper_out_abandon(&out);
  GDir *d = g_dir_open(dir, 0, NULL);
  assert_null(g_dir_read_name(d));
  g_dir_close(d);
  rmdir(dir);
  g_free(path);
  g_free(dir);
}

static void test_read_file(void **state) {
  (void)state;
  char *dir = temp_dir();
  char *path = g_build_filename(dir, "in.txt", NULL);
  GError *err = NULL;
  assert_true(piper_write_file(path, "abc", 3, &err));
  size_t len = 0;
  char *text = piper_read_file(path, 1 << 20, &len, &err);
  assert_non_null(text);
  assert_int_equal(len, 3);
  assert_string_equal(text, "abc");
  g_free(text);
  /* over the limit, a directory, a FIFO (would block), a missing file: one input error each */
  assert_null(piper_read_file(path, 2, &len, &err));
  assert_non_null(strstr(err->message, "larger than"));
  g_clear_error(&err);
  assert_null(piper_read_file(dir, 1 << 20, &len, &err));
  assert_string_equal(err->message + strlen(dir), ": not a regular file");
  g_clear_error(&err);
  char *fifo = g_build_filename(dir, "pipe", NULL);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  /* no writer: a blocking open would hang here; read, it is empty at once */
  assert_null(piper_read_file(fifo, 1 << 20, &len, &err));
  assert_int_equal(err->code, PIPER_ERROR_INPUT);
  assert_non_null(strstr(err->message, "a pipe with nothing written to it"));
  g_clear_error(&err);
  remove(fifo);
  remove(path);
  assert_null(piper_read_file(path, 1 << 20, &len, &err));
  assert_non_null(strstr(err->message, "cannot open"));
  g_clear_error(&err);
  rmdir(dir);
  g_free(fifo);
  g_free(path);
  g_free(dir);
}

static void test_duplicate_keys(void **state) {
  (void)state;
  static const struct {
    const char *text, *want;
  } cases[] = {
      {"{\"a\": 1, \"b\": 2, \"a\": 3}", "f.json: key \"a\" appears twice in the top-level object"},
      {"{\"piper\": {\"x\": 1, \"x\": 1}}", "f.json: key \"x\" appears twice in \"piper\""},
      {"{\"s\": [{}, {\"k\": [1, {\"q\": 0, \"q\": 0}]}]}",
       "f.json: key \"q\" appears twice in \"s[1].k[1]\""},
  };
  for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
    GError *err = NULL;
    cJSON *root = json_parse_buffer("f.json", cases[i].text, strlen(cases[i].text), &err);
    assert_non_null(root);
    assert_false(json_refuse_duplicate_keys(root, "f.json", &err));
    assert_int_equal(err->code, PIPER_ERROR_INPUT);
    assert_string_equal(err->message, cases[i].want);
    g_error_free(err);
    cJSON_Delete(root);
  }
  /* past the scan's size, the hash set finds the second "k7" too */
  cJSON *big = cJSON_CreateObject();
  for (int k = 0; k < 40; k++) {
    char key[16];
    snprintf(key, sizeof key, "k%d", k);
    cJSON_AddNumberToObject(big, key, k);
  }
  assert_true(json_refuse_duplicate_keys(big, "f.json", NULL));
  cJSON_AddNumberToObject(big, "k7", 0);
  GError *err = NULL;
  assert_false(json_refuse_duplicate_keys(big, "f.json", &err));
  assert_string_equal(err->message, "f.json: key \"k7\" appears twice in the top-level object");
  g_error_free(err);
  cJSON_Delete(big);
  const char *fine = "{\"a\": {\"a\": 1}, \"b\": [{\"a\": 1}, {\"a\": 2}]}";
  cJSON *root = json_parse_buffer("f.json", fine, strlen(fine), NULL);
  assert_true(json_refuse_duplicate_keys(root, "f.json", NULL));
  cJSON_Delete(root);
}

static void test_hash_clock_compare_parse(void **state) {
  (void)state;
  /* FNV-1a 64 reference values: "" and "a" */
  assert_true(piper_fnv1a(PIPER_FNV1A_INIT, "", 0) == 0xcbf29ce484222325ull);
  assert_true(piper_fnv1a(PIPER_FNV1A_INIT, "a", 1) == 0xaf63dc4c8601ec8cull);
  /* continuing a hash equals hashing the concatenation */
  uint64_t h = piper_fnv1a(piper_fnv1a(PIPER_FNV1A_INIT, "ab", 2), "cd", 2);
  assert_true(h == piper_fnv1a(PIPER_FNV1A_INIT, "abcd", 4));
  double t0 = piper_clock_seconds(), t1 = piper_clock_seconds();
  assert_true(t1 >= t0 && t0 > 0);
  uint32_t u[] = {3, 1, 2, UINT32_MAX, 0};
  qsort(u, 5, sizeof *u, piper_cmp_u32);
  assert_true(u[0] == 0 && u[1] == 1 && u[4] == UINT32_MAX);
  uint64_t w[] = {UINT64_MAX, 5, 0};
  qsort(w, 3, sizeof *w, piper_cmp_u64);
  assert_true(w[0] == 0 && w[2] == UINT64_MAX);
  double x[] = {2.5, -1, 0};
  qsort(x, 3, sizeof *x, piper_cmp_double);
  assert_true(x[0] == -1 && x[2] == 2.5);
  uint32_t v;
  assert_true(piper_parse_u32("42", 1, 100, &v) && v == 42);
  assert_false(piper_parse_u32("0", 1, 100, &v));
  assert_false(piper_parse_u32("4x", 1, 100, &v));
  assert_false(piper_parse_u32("", 1, 100, &v));
  double d;
  assert_true(piper_parse_double("1e-3", 0, 1, &d) && d == 1e-3);
  assert_false(piper_parse_double("nan", 0, 1, &d));
  assert_false(piper_parse_double("2", 0, 1, &d));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_input_error_is_one_line),
      cmocka_unit_test(test_quote),
      cmocka_unit_test(test_write_regular_and_new),
      cmocka_unit_test(test_symlink_is_followed),
      cmocka_unit_test(test_planted_temporary_link),
      cmocka_unit_test(test_devices_written_in_place),
      cmocka_unit_test(test_fifo_written_in_place),
      cmocka_unit_test(test_abandon_leaves_nothing),
      cmocka_unit_test(test_read_file),
      cmocka_unit_test(test_duplicate_keys),
      cmocka_unit_test(test_hash_clock_compare_parse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
