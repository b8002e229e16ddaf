/* options: the programs' option tables read and printed (options.h). */
#include <stdio.h>
#include <string.h>

#include "../base/base.h"
#include "options.h"

void options_print_version(const struct option_program *p) {
  printf("%s %s\n", p->name, PIPER_VERSION);
}

/* "  -o, --out DIR" or "  --directives, --base-schedule FILE": short aliases first. */
static GString *help_label(const struct option_spec *o) {
  GString *s = g_string_new("  ");
  bool short_alias = o->alias && o->alias[1] != '-';
  if (short_alias)
    g_string_append_printf(s, "%s, ", o->alias);
  g_string_append(s, o->name);
  if (o->alias && !short_alias)
    g_string_append_printf(s, ", %s", o->alias);
  if (o->metavar)
    g_string_append_printf(s, " %s", o->metavar);
  return s;
}

/* One option: its label, then its help text from the help column on (on the next line when
 * the label reaches into the column), continuation lines indented to the column. */
static void print_option_help(const struct option_spec *o, int column) {
  GString *label = help_label(o);
  fputs(label->str, stdout);
  int at = (int)label->len;
  g_string_free(label, TRUE);
  if (!o->help) {
    putchar('\n');
    return;
  }
  if (at >= column - 1) {
    putchar('\n');
    at = 0;
  }
  for (const char *line = o->help; line;) {
    const char *end = strchr(line, '\n');
    int len = end ? (int)(end - line) : (int)strlen(line);
    printf("%*s%.*s\n", column - at, "", len, line);
    at = 0;
    line = end ? end + 1 : NULL;
  }
}

void options_print_help(const struct option_program *p) {
  fputs(p->usage, stdout);
  for (const struct option_spec *o = p->options; o->kind != OPTION_END; o++) {
    if (o->kind == OPTION_HEADING)
      printf("%s\n", o->help);
    else
      print_option_help(o, p->help_column);
  }
  if (p->epilogue)
    fputs(p->epilogue, stdout);
}

static const struct option_spec *find_option(const struct option_program *p, const char *arg) {
  for (const struct option_spec *o = p->options; o->kind != OPTION_END; o++)
    if (o->kind != OPTION_HEADING &&
        (strcmp(arg, o->name) == 0 || (o->alias && strcmp(arg, o->alias) == 0)))
      return o;
  return NULL;
}

/* Stores the value text of option o (as typed: arg) into its target; a usage error otherwise. */
static int store_value(const struct option_program *p, const struct option_spec *o, const char *arg,
                       const char *text, void *args) {
  void *target = (char *)args + o->offset;
  double real = 0;
  switch (o->kind) {
  case OPTION_STRING: *(const char **)target = text; return OPTIONS_CONTINUE;
  case OPTION_U32:
    if (!piper_parse_u32(text, (uint32_t)o->lo, (uint32_t)o->hi, target))
      return piper_usage_error(p->name, "%s: expected an integer in [%u, %u], got \"%s\"", arg,
                               (uint32_t)o->lo, (uint32_t)o->hi, text);
    return OPTIONS_CONTINUE;
  case OPTION_DOUBLE:
  case OPTION_FLOAT:
    if (!piper_parse_double(text, o->lo, o->hi, &real))
      return piper_usage_error(p->name, "%s: \"%s\" is not a number in [%g, %g]", arg, text, o->lo,
                               o->hi);
    if (o->kind == OPTION_DOUBLE)
      *(double *)target = real;
    else
      *(float *)target = (float)real;
    return OPTIONS_CONTINUE;
  default: PIPER_UNREACHABLE();
  }
}

/* An argument that names no option: the program's positional argument, if it takes one. */
static int take_positional(const struct option_program *p, const char *arg, void *args) {
  bool looks_like_option = arg[0] == '-' && arg[1];
  if (!p->positional || looks_like_option)
    return piper_usage_error(p->name, "unknown option %s", arg);
  GError *err = NULL;
  if (p->positional(args, arg, &err))
    return OPTIONS_CONTINUE;
  int rc = piper_usage_error(p->name, "%s", err ? err->message : arg);
  g_clear_error(&err);
  return rc;
}

int options_parse(const struct option_program *p, void *args, int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    const struct option_spec *o = find_option(p, arg);
    int rc = OPTIONS_CONTINUE;
    if (!o) {
      rc = take_positional(p, arg, args);
    } else if (o->kind == OPTION_ACTION) {
      o->action(p);
      return 0;
    } else if (o->kind == OPTION_FLAG) {
      *(bool *)((char *)args + o->offset) = true;
    } else if (i + 1 >= argc) {
      rc = piper_usage_error(p->name, "%s needs a value", arg);
    } else {
      rc = store_value(p, o, arg, argv[++i], args);
    }
    if (rc != OPTIONS_CONTINUE)
      return rc;
  }
  return OPTIONS_CONTINUE;
}

void options_print_notes(const char *program, const GString *notes) {
  if (!notes)
    return;
  g_auto(GStrv) lines = g_strsplit(notes->str, "\n", -1);
  for (char **l = lines; *l; l++)
    if (**l)
      fprintf(stderr, "%s: note: %s\n", program, *l);
}

const char *options_compile_arg_given(const struct compile_args *ca) {
  const struct {
    bool given;
    const char *name;
  } args[] = {{ca->model != NULL, "--model"},           {ca->directives != NULL, "--directives"},
              {ca->layout != NULL, "--layout"},         {ca->schedule != NULL, "--schedule"},
              {ca->ranks > 0, "--ranks"},               {ca->mbs > 0, "--num-micro-batches (--mbs)"},
              {ca->micro_batch_size > 0, "--micro-batch-size"},
              {ca->seq_length > 0, "--seq-length"},     {ca->fp8 != NULL, "--fp8"},
              {ca->global_batch_size > 0, "--global-batch-size"},
              {ca->pp_regions > 0, "--pp-regions"},     {ca->keep_order, "--keep-order"},
              {ca->import_csv != NULL, "--import-csv"},
              {ca->microbatch_group > 0, "--microbatch-group"}};
  for (size_t i = 0; i < G_N_ELEMENTS(args); i++)
    if (args[i].given)
      return args[i].name;
  return NULL;
}
