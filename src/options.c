/* Options: read once from the environment into hak_opt. */
#include "internal.h"

#include <sys/auxv.h>

extern char **environ;

hak_options_t hak_opt = {
#define HAK_OPT_INIT(field, name, def, lo, hi, doc) .field = def,
    HAK_OPTIONS(HAK_OPT_INIT)
#undef HAK_OPT_INIT
#define HAK_STR_INIT(field, name, def, doc) .field = def,
    HAK_STR_OPTIONS(HAK_STR_INIT)
#undef HAK_STR_INIT
};

typedef struct {
  const char *name;
  long *value;
  long lo, hi;
  bool set;
} opt_slot_t;

static bool parse_long(const char *s, long *out) {
  if (*s == 0) return false;
  long v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9' || v > (LONG_MAX - 9) / 10) return false;
    v = v * 10 + (*s - '0');
  }
  *out = v;
  return true;
}

/* Applies a profile's defaults; false if the name is unknown. */
static bool apply_profile(const char *name) {
#define HAK_PROFILE_APPLY(pname, delay, segs, large, doc)                     \
  if (strcmp(name, pname) == 0) {                                            \
    hak_opt.purge_delay_ms = delay;                                          \
    hak_opt.segment_cache = segs;                                            \
    hak_opt.large_cache_mb = large;                                          \
    hak_opt.profile = pname;                                                 \
    return true;                                                             \
  }
  HAK_PROFILES(HAK_PROFILE_APPLY)
#undef HAK_PROFILE_APPLY
  return false;
}

void hak_options_load(void) {
  opt_slot_t slots[] = {
#define HAK_OPT_SLOT(field, name, def, lo, hi, doc) {name, &hak_opt.field, lo, hi, false},
      HAK_OPTIONS(HAK_OPT_SLOT)
#undef HAK_OPT_SLOT
  };
  const size_t nslots = sizeof slots / sizeof slots[0];
  /* A program that runs with more privileges than its caller (set-user-ID
   * or set-group-ID, or file capabilities) keeps the defaults: the caller
   * sets the environment, and HAKMEM_STATS_FILE would have the program
   * write any file it may. */
  if (environ == NULL || getauxval(AT_SECURE)) return;
  /* The profile first, so explicit variables override its presets. */
  for (char **e = environ; *e; e++) {
    if (strncmp(*e, "HAKMEM_PROFILE=", 15) != 0) continue;
    if (!apply_profile(*e + 15))
      hak_print(2, "hakmem: unknown HAKMEM_PROFILE=%s (expected balanced, throughput or lowmem)\n",
                *e + 15);
  }
  for (char **e = environ; *e; e++) {
    if (strncmp(*e, "HAKMEM_", 7) != 0 || strncmp(*e, "HAKMEM_PROFILE=", 15) == 0) continue;
    const char *name = *e + 7;
    const char *eq = strchr(name, '=');
    if (eq == NULL) continue;
    size_t len = (size_t)(eq - name);
#define HAK_STR_SET(field, sname, def, doc)                                    \
    if (strlen(sname) == len && strncmp(sname, name, len) == 0) {              \
      hak_opt.field = eq + 1;                                                  \
      continue;                                                                \
    }
    HAK_STR_OPTIONS(HAK_STR_SET)
#undef HAK_STR_SET
    opt_slot_t *slot = NULL;
    for (size_t i = 0; i < nslots; i++)
      if (strlen(slots[i].name) == len && strncmp(slots[i].name, name, len) == 0) slot = &slots[i];
    if (slot == NULL) {
      char var[64];
      snprintf(var, sizeof var, "%.*s", (int)(len < 40 ? len : 40), name);
      hak_print(2, "hakmem: unknown option HAKMEM_%s ignored\n", var);
      continue;
    }
    long v;
    if (!parse_long(eq + 1, &v) || v < slot->lo || v > slot->hi) {
      hak_print(
          2, "hakmem: bad value HAKMEM_%s=%s (expected an integer in [%ld, %ld]); default kept\n",
          slot->name, eq + 1, slot->lo, slot->hi);
      continue;
    }
    *slot->value = v;
  }
}

void hak_options_print(int fd) {
  hak_print(fd, "hakmem: %s, profile %s\nhakmem: built with %s\n", hak_version(), hak_opt.profile,
            HAK_BUILD_FLAGS);
#define HAK_OPT_PRINT(field, name, def, lo, hi, doc)                           \
  hak_print(fd, "hakmem:   HAKMEM_%-16s = %ld\n", name, hak_opt.field);
  HAK_OPTIONS(HAK_OPT_PRINT)
#undef HAK_OPT_PRINT
#define HAK_STR_PRINT(field, name, def, doc)                                   \
  hak_print(fd, "hakmem:   HAKMEM_%-16s = %s\n", name, hak_opt.field);
  HAK_STR_OPTIONS(HAK_STR_PRINT)
#undef HAK_STR_PRINT
}
