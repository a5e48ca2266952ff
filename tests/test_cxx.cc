// C++ allocation through hakmem: new/delete in all their forms, aligned new,
// standard containers, and out-of-memory behaviour (bad_alloc / nullptr).
#include "harness.h"

#include <malloc.h>
#include <stdint.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#ifndef HAK_TEST_LIBC
#include "hakmem.h"
#endif

// Keeps new/delete pairs from being elided by the optimizer.
static void escape(void *p) { __asm__ volatile("" : : "g"(p) : "memory"); }
static size_t opaque(size_t v) {
  __asm__ volatile("" : "+r"(v));
  return v;
}
static bool aligned_to(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }
// The bytes of blocks in use, small and large: a delete that kept its block
// would leave them counted.
static size_t in_use_bytes() {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

struct Tracked {
  static std::atomic<long> live;
  unsigned char payload[40];
  Tracked() {
    live++;
    memset(payload, 0x3c, sizeof payload);
  }
  ~Tracked() { live--; }
};
std::atomic<long> Tracked::live{0};

TEST(new_delete_scalar_and_array) {
  for (size_t n = 1; n < 5000; n += 37) {
    char *a = new char[n];
    escape(a);
    CHECK(aligned_to(a, 16) || n < 16);
    memset(a, 1, n);
    delete[] a;
  }
  Tracked *t = new Tracked;
  escape(t);
  CHECK(Tracked::live == 1);
  CHECK(aligned_to(t, alignof(std::max_align_t)));
  delete t;
  Tracked *arr = new Tracked[1000];
  escape(arr);
  CHECK(Tracked::live == 1000);
  for (int i = 0; i < 1000; i++) CHECK(arr[i].payload[39] == 0x3c);
  delete[] arr;
  CHECK(Tracked::live == 0);
  long *big = new long[(8u << 20) / sizeof(long)];
  escape(big);
  big[0] = 1;
  big[(8u << 20) / sizeof(long) - 1] = 2;
  delete[] big;
}

TEST(nothrow_new_succeeds_for_normal_sizes) {
  for (size_t n = 1; n <= (4u << 20); n *= 3) {
    char *p = new (std::nothrow) char[n];
    escape(p);
    CHECK_MSG(p != nullptr, "nothrow new[%zu] = nullptr", n);
    if (p) {
      p[0] = p[n - 1] = 7;
      delete[] p;
    }
  }
  int *q = new (std::nothrow) int(42);
  REQUIRE(q);
  CHECK(*q == 42);
  delete q;
}

TEST(sized_delete_all_sizes) {
  size_t before = in_use_bytes();
  for (int rep = 0; rep < 3; rep++)
    for (size_t n = 1; n <= (2u << 20); n = n < 2048 ? n + 1 : n + n / 7) {
      void *p = ::operator new(n);
      escape(p);
      CHECK(p != nullptr);
      memset(p, 0x6a, n);
      ::operator delete(p, n);
    }
  Tracked *t = new Tracked;
  escape(t);
  ::operator delete(static_cast<void *>(t), sizeof(Tracked));  // raw sized delete (no dtor)
  Tracked::live--;
  void *a = ::operator new[](1000);
  escape(a);
  ::operator delete[](a, 1000);
  CHECK_MSG(in_use_bytes() < before + 4096, "%zu bytes still in use", in_use_bytes() - before);
}

struct alignas(64) Line {
  unsigned char b[64];
};
struct alignas(4096) Page {
  unsigned char b[4096];
};

TEST(aligned_new_for_overaligned_types) {
  std::vector<Line *> lines;
  std::vector<Page *> pages;
  for (int i = 0; i < 300; i++) {
    Line *l = new Line;
    CHECK_MSG(aligned_to(l, 64), "new Line = %p", (void *)l);
    memset(l->b, i, 64);
    lines.push_back(l);
    if (i % 10 == 0) {
      Page *p = new Page;
      CHECK_MSG(aligned_to(p, 4096), "new Page = %p", (void *)p);
      memset(p->b, i, 4096);
      pages.push_back(p);
    }
  }
  Line *la = new Line[33];
  CHECK(aligned_to(la, 64));
  memset(la, 1, sizeof(Line) * 33);
  Page *pa = new Page[5];
  CHECK(aligned_to(pa, 4096));
  memset(pa, 2, sizeof(Page) * 5);
  for (size_t i = 0; i < lines.size(); i++) {
    CHECK(lines[i]->b[63] == (unsigned char)i);
    delete lines[i];
  }
  for (size_t i = 0; i < pages.size(); i++) {
    CHECK(pages[i]->b[4095] == (unsigned char)(i * 10));
    delete pages[i];
  }
  delete[] la;
  delete[] pa;
}

TEST(operator_new_with_align_val_t) {
  size_t aligns[] = {16, 32, 256, 4096, 65536, 1u << 21};
  for (size_t a : aligns)
    for (size_t n : {size_t(1), size_t(100), a, a * 3 + 1}) {
      void *p = ::operator new(n, std::align_val_t(a));
      escape(p);
      CHECK_MSG(aligned_to(p, a), "operator new(%zu, align %zu) = %p", n, a, p);
      memset(p, 0x5b, n);
      if (n % 2)
        ::operator delete(p, std::align_val_t(a));
      else
        ::operator delete(p, n, std::align_val_t(a));  // sized + aligned
      void *q = ::operator new[](n, std::align_val_t(a), std::nothrow);
      CHECK(q && aligned_to(q, a));
      ::operator delete[](q, std::align_val_t(a));
    }
  void *p = ::operator new(100, std::align_val_t(256));
  CHECK(aligned_to(p, 256));
  ::operator delete(p, std::align_val_t(256));
}

TEST(new_of_huge_size_throws_bad_alloc) {
  bool threw = false;
  try {
    void *p = ::operator new(opaque(std::numeric_limits<size_t>::max() / 2));
    escape(p);
    ::operator delete(p);
  } catch (const std::bad_alloc &) {
    threw = true;
  }
  CHECK_MSG(threw, "operator new(SIZE_MAX/2) did not throw std::bad_alloc");
  threw = false;
  try {
    char *p = new char[opaque((size_t)1 << 62)];
    escape(p);
    delete[] p;
  } catch (const std::bad_alloc &) {
    threw = true;
  }
  CHECK_MSG(threw, "new char[1<<62] did not throw std::bad_alloc");
  threw = false;
  try {
    void *p = ::operator new(opaque(std::numeric_limits<size_t>::max() - 64), std::align_val_t(64));
    escape(p);
    ::operator delete(p, std::align_val_t(64));
  } catch (const std::bad_alloc &) {
    threw = true;
  }
  CHECK_MSG(threw, "aligned operator new(SIZE_MAX-64) did not throw std::bad_alloc");
  // The allocator still works afterwards.
  std::string s(100000, 'x');
  CHECK(s.size() == 100000 && s[99999] == 'x');
}

TEST(nothrow_new_of_huge_size_returns_nullptr) {
  void *p = ::operator new(opaque(std::numeric_limits<size_t>::max() / 2), std::nothrow);
  CHECK(p == nullptr);
  char *a = new (std::nothrow) char[opaque((size_t)1 << 62)];
  CHECK(a == nullptr);
  void *q = ::operator new(opaque(std::numeric_limits<size_t>::max() - 4096),
                           std::align_val_t(4096), std::nothrow);
  CHECK(q == nullptr);
  int *ok = new (std::nothrow) int[10]();
  CHECK(ok != nullptr && ok[9] == 0);
  delete[] ok;
}

TEST(vector_string_map_churn_keeps_values) {
  std::map<std::string, std::vector<int>> m;
  for (int i = 0; i < 40000; i++) {
    std::string k = "key-" + std::to_string(i * 7919 % 100003) + std::string(i % 50, 'z');
    auto &v = m[k];
    for (int j = 0; j < i % 17; j++) v.push_back(i + j);
  }
  long sum = 0;
  size_t count = 0;
  for (auto &kv : m) {
    count++;
    for (int x : kv.second) sum += x;
  }
  // Expected sum computed independently of the container.
  long want = 0;
  for (int i = 0; i < 40000; i++)
    for (int j = 0; j < i % 17; j++) want += i + j;
  CHECK(count == 40000);
  CHECK_MSG(sum == want, "sum %ld != %ld", sum, want);
  for (int i = 0; i < 40000; i += 2) {
    std::string k = "key-" + std::to_string(i * 7919 % 100003) + std::string(i % 50, 'z');
    CHECK(m.erase(k) == 1);
  }
  CHECK(m.size() == 20000);
  std::unordered_map<int, std::string> um;
  for (int i = 0; i < 100000; i++) um[i] = std::string(i % 300, char('a' + i % 26));
  for (int i = 0; i < 100000; i += 997)
    CHECK(um[i].size() == (size_t)(i % 300) && (um[i].empty() || um[i][0] == char('a' + i % 26)));
  std::vector<std::string> vs;
  for (int i = 0; i < 200000; i++) vs.emplace_back(std::to_string(i));
  vs.shrink_to_fit();
  CHECK(vs[123456] == "123456");
}

TEST(containers_across_threads) {
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  std::vector<std::vector<std::string>> produced(4);
  for (int t = 0; t < 4; t++)
    ts.emplace_back([t, &produced] {
      for (int i = 0; i < 50000; i++) produced[t].push_back(std::string(20 + i % 200, char('A' + t)));
    });
  for (auto &th : ts) th.join();
  ts.clear();
  // Other threads destroy what these produced (remote frees of C++ objects).
  for (int t = 0; t < 4; t++)
    ts.emplace_back([t, &produced, &bad] {
      auto &v = produced[(t + 1) % 4];
      for (auto &s : v)
        if (s[0] != char('A' + (t + 1) % 4) || s.back() != s[0]) bad++;
      std::vector<std::string>().swap(v);
    });
  for (auto &th : ts) th.join();
  CHECK(bad == 0);
}

TEST(unique_ptr_and_shared_ptr) {
  for (int i = 0; i < 20000; i++) {
    auto u = std::make_unique<Tracked>();
    auto s = std::make_shared<std::vector<int>>(i % 100, i);
    auto a = std::make_unique<int[]>(i % 1000 + 1);
    a[0] = i;
    CHECK(a[0] == i);
    CHECK(s->size() == (size_t)(i % 100));
  }
  CHECK(Tracked::live == 0);
}

#ifndef HAK_TEST_LIBC
TEST(operator_new_memory_is_served_by_hakmem) {
  // hak_usable_size understands only hakmem's blocks: operator new (directly
  // or via malloc) must hand out hakmem memory.
  for (size_t n : {size_t(8), size_t(100), size_t(5000), size_t(200000), size_t(3u << 20)}) {
    void *p = ::operator new(n);
    escape(p);
    CHECK_MSG(hak_usable_size(p) >= n, "hak_usable_size(operator new(%zu)) = %zu", n,
              hak_usable_size(p));
    CHECK(hak_usable_size(p) == malloc_usable_size(p));
    ::operator delete(p);
    void *q = ::operator new(n, std::align_val_t(4096));
    CHECK(hak_usable_size(q) >= n);
    ::operator delete(q, std::align_val_t(4096));
  }
  char *h = static_cast<char *>(hak_malloc(64));
  REQUIRE(h);
  hak_free(h);
}
#endif

TEST_MAIN("cxx")
