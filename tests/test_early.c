/* The early-process cases: allocation before main (constructors), from the
 * dynamic loader (dlopen, dlsym, dlerror allocate), and from inside
 * pthread_key_create/pthread_setspecific (glibc allocates key pages past the
 * first 32 keys) must neither recurse nor crash. */
#define _GNU_SOURCE
#include "harness.h"

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>

static void *early_blocks[64];
static int early_ok;

__attribute__((constructor(101))) static void allocate_before_main(void) {
  for (int i = 0; i < 64; i++) {
    early_blocks[i] = malloc((size_t)16 << (i % 16));
    if (early_blocks[i]) memset(early_blocks[i], i, 16);
  }
  void *p = calloc(100, 100);
  p = realloc(p, 100000);
  free(p);
  early_ok = 1;
}

TEST(blocks_from_a_constructor_are_usable_and_freeable) {
  CHECK(early_ok);
  for (int i = 0; i < 64; i++) {
    REQUIRE(early_blocks[i] != NULL);
    CHECK(((unsigned char *)early_blocks[i])[15] == i);
    CHECK(malloc_usable_size(early_blocks[i]) >= (size_t)16 << (i % 16));
    free(early_blocks[i]);
  }
}

TEST(dlopen_dlsym_dlerror_allocate_through_hakmem) {
  for (int i = 0; i < 20; i++) {
    void *h = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(h != NULL);
    double (*cosine)(double) = (double (*)(double))dlsym(h, "cos");
    CHECK(cosine != NULL && cosine(0.0) == 1.0);
    CHECK(dlsym(h, "no_such_symbol_here") == NULL);
    const char *err = dlerror(); /* allocates its message */
    CHECK(err != NULL && strstr(err, "no_such_symbol_here") != NULL);
    CHECK(dlsym(RTLD_NEXT, "malloc") != NULL || dlerror() != NULL);
    dlclose(h);
  }
  CHECK(dlopen("/nonexistent/libnothing.so", RTLD_NOW) == NULL);
  CHECK(dlerror() != NULL);
}

static pthread_key_t keys[200];
static void destroy_value(void *v) { free(v); }

static void *use_many_keys(void *arg) {
  for (int i = 0; i < 200; i++) {
    void *v = malloc(40);
    if (pthread_setspecific(keys[i], v) != 0) return (void *)1;
  }
  return NULL;
}

TEST(many_thread_keys_allocate_inside_pthread) {
  /* past the first 32 keys glibc allocates second-level arrays with malloc */
  for (int i = 0; i < 200; i++) REQUIRE(pthread_key_create(&keys[i], destroy_value) == 0);
  for (int round = 0; round < 20; round++) {
    pthread_t t;
    void *rc = (void *)1;
    REQUIRE(pthread_create(&t, NULL, use_many_keys, NULL) == 0);
    pthread_join(t, &rc);
    CHECK(rc == NULL);
  }
  CHECK(use_many_keys(NULL) == NULL); /* the main thread too */
}

TEST_MAIN("early")
