// The prefaulter on real memfd mappings: which pages are in this process's page tables is
// read from /proc/self/pagemap (bit 63: present).
#include "common/prefault.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace gmux {
namespace {

constexpr size_t kPage = 4096;

// Pages of [p, p + n) present in this process's page tables.
size_t PresentPages(const void* p, size_t n) {
  int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return SIZE_MAX;
  std::vector<uint64_t> entries(n / kPage);
  const off_t at = static_cast<off_t>(reinterpret_cast<uintptr_t>(p) / kPage * sizeof(uint64_t));
  const ssize_t got = ::pread(fd, entries.data(), entries.size() * sizeof(uint64_t), at);
  ::close(fd);
  if (got != static_cast<ssize_t>(entries.size() * sizeof(uint64_t))) return SIZE_MAX;
  size_t present = 0;
  for (uint64_t e : entries) present += (e >> 63) & 1;
  return present;
}

// A buffer's storage as the ICD makes it: a sealed-size memfd, mapped shared, not populated.
struct Storage {
  explicit Storage(size_t n) : size(n) {
    fd = ::memfd_create("prefault-test", MFD_CLOEXEC);
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(n)) == 0) {
      void* p = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) map = static_cast<uint8_t*>(p);
    }
  }
  ~Storage() {
    if (map != nullptr) ::munmap(map, size);
    if (fd >= 0) ::close(fd);
  }
  size_t size;
  int fd = -1;
  uint8_t* map = nullptr;
};

TEST(PrefaulterTest, PopulatesTheWholeMappingAndChangesNoByte) {
  Storage s(16u << 20);
  ASSERT_NE(s.map, nullptr);
  // Written before the job: the first page and one in the middle (present from here on).
  std::memset(s.map, 0x5a, kPage);
  std::memset(s.map + (8u << 20), 0xa5, kPage);
  ASSERT_EQ(PresentPages(s.map, s.size), 2u);
  auto job = Prefaulter::Get().Start(s.map, s.size);
  ASSERT_NE(job, nullptr);
  EXPECT_TRUE(Prefaulter::Get().Wait(job));
  EXPECT_EQ(PresentPages(s.map, s.size), s.size / kPage);
  for (size_t i = 0; i < s.size; ++i) {
    const bool mid = i >= (8u << 20) && i < (8u << 20) + kPage;
    const uint8_t want = i < kPage ? 0x5a : mid ? 0xa5 : 0;
    if (s.map[i] != want) {
      FAIL() << "byte " << i << " is " << int{s.map[i]} << ", was " << int{want};
    }
  }
  Prefaulter::Get().Stop(job);  // after the end: returns at once
}

TEST(PrefaulterTest, JobsQueuedTogetherAreAllServed) {
  std::vector<std::unique_ptr<Storage>> all;
  std::vector<std::shared_ptr<Prefaulter::Job>> jobs;
  for (size_t bytes : {size_t{3} << 20, size_t{8} << 20, size_t{20000}}) {  // one under a chunk
    all.push_back(std::make_unique<Storage>(bytes));
    ASSERT_NE(all.back()->map, nullptr);
    jobs.push_back(Prefaulter::Get().Start(all.back()->map, all.back()->size));
    ASSERT_NE(jobs.back(), nullptr);
  }
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_TRUE(Prefaulter::Get().Wait(jobs[i]));
    const size_t pages = (all[i]->size + kPage - 1) / kPage;
    EXPECT_EQ(PresentPages(all[i]->map, pages * kPage), pages);
  }
}

TEST(PrefaulterTest, AStoppedJobIsNotTouchedAgain) {
  // Stopped while running or still queued: once Stop() returns, no page of its mapping is
  // populated any more. The thread serves jobs in order, so once a later job is done it is past
  // the stopped ones.
  auto first = std::make_unique<Storage>(64u << 20);
  auto second = std::make_unique<Storage>(64u << 20);
  ASSERT_NE(first->map, nullptr);
  ASSERT_NE(second->map, nullptr);
  auto a = Prefaulter::Get().Start(first->map, first->size);
  auto b = Prefaulter::Get().Start(second->map, second->size);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Prefaulter::Get().Stop(b);
  Prefaulter::Get().Stop(a);
  const size_t a_pages = PresentPages(first->map, first->size);
  const size_t b_pages = PresentPages(second->map, second->size);
  Prefaulter::Get().Wait(a);  // returns: stopped or complete
  Prefaulter::Get().Wait(b);
  Storage s(2u << 20);
  ASSERT_NE(s.map, nullptr);
  auto c = Prefaulter::Get().Start(s.map, s.size);
  EXPECT_TRUE(Prefaulter::Get().Wait(c));
  EXPECT_EQ(PresentPages(first->map, first->size), a_pages);
  EXPECT_EQ(PresentPages(second->map, second->size), b_pages);
  // Populated from the end backwards: a stopped job's pages are a tail of its mapping.
  EXPECT_EQ(PresentPages(first->map + first->size - a_pages * kPage, a_pages * kPage), a_pages);
}

// Minor page faults this process has taken so far.
long MinorFaults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

TEST(PrefaulterTest, WritesAfterAJobFaultNoMore) {
  // The thread only reads: the pages it faults in must be mapped writable, or the application's
  // writes would fault once more each. (Counted for the whole process: a sanitizer's shadow
  // memory faults in too as memset is checked.)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer's shadow memory faults with every write checked";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
  GTEST_SKIP() << "the sanitizer's shadow memory faults with every write checked";
#endif
#endif
  Storage s(16u << 20);
  ASSERT_NE(s.map, nullptr);
  auto job = Prefaulter::Get().Start(s.map, s.size);
  ASSERT_TRUE(Prefaulter::Get().Wait(job));
  const long before = MinorFaults();
  std::memset(s.map, 0x3c, s.size);
  const long taken = MinorFaults() - before;
  EXPECT_LT(taken, static_cast<long>(s.size / kPage / 16)) << "of " << s.size / kPage << " pages";
  // Without the job, each page faults (the check above can fail).
  Storage t(16u << 20);
  ASSERT_NE(t.map, nullptr);
  const long cold = MinorFaults();
  std::memset(t.map, 0x3c, t.size);
  EXPECT_GE(MinorFaults() - cold, static_cast<long>(t.size / kPage / 2));
}

TEST(PrefaulterTest, AReadOnlyMappingOfAnOddSizeIsFaultedInWhole) {
  // Read-only (the thread never writes) and not a multiple of the page or the chunk: every page
  // of it, the last partial one too.
  const size_t bytes = (3u << 20) + 100;
  Storage rw(bytes);
  ASSERT_NE(rw.map, nullptr);
  void* ro = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, rw.fd, 0);
  ASSERT_NE(ro, MAP_FAILED);
  auto job = Prefaulter::Get().Start(ro, bytes);
  ASSERT_NE(job, nullptr);
  EXPECT_TRUE(Prefaulter::Get().Wait(job));
  const size_t pages = (bytes + kPage - 1) / kPage;
  EXPECT_EQ(PresentPages(ro, pages * kPage), pages);
  ::munmap(ro, bytes);
}

TEST(PrefaulterTest, NothingToDoIsNoJob) {
  EXPECT_EQ(Prefaulter::Get().Start(nullptr, 4096), nullptr);
  Storage s(4096);
  EXPECT_EQ(Prefaulter::Get().Start(s.map, 0), nullptr);
  Prefaulter::Get().Stop(nullptr);
  EXPECT_FALSE(Prefaulter::Get().Wait(nullptr));
}

}  // namespace
}  // namespace gmux
