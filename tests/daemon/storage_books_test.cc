// StorageBooks' kept mappings (daemon/session.h): a released buffer's mapping of the client's
// shared memory is kept, still booked, for the next buffer on the same memfd; within the client
// pool's bounds, the oldest pushed out and unbooked, all of them given up when memory is wanted.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "daemon/session.h"

namespace gmux::daemon {
namespace {

struct Memfd {
  std::shared_ptr<HostBuffer> mapping;
  uint64_t dev = 0, ino = 0;
};

// A sealed memfd of `size` bytes mapped as a buffer's storage is.
Memfd MapNew(size_t size) {
  int fd = ::memfd_create("gmux-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
  EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  struct stat st{};
  EXPECT_EQ(::fstat(fd, &st), 0);
  auto m = HostBuffer::MapSealed(fd, size, /*populate=*/false);  // takes fd
  EXPECT_TRUE(m.ok());
  return {m.ok() ? *m : nullptr, static_cast<uint64_t>(st.st_dev),
          static_cast<uint64_t>(st.st_ino)};
}

// Books `m` as a buffer on shared memory (what Session::StorageRoom does), then keeps it as its
// release does.
void BookAndKeep(StorageBooks& b, const Memfd& m, std::vector<std::shared_ptr<HostBuffer>>& gone) {
  std::lock_guard<std::mutex> lock(b.mu);
  b.bytes += m.mapping->size();
  ++b.buffers;
  b.KeepLocked({m.dev, m.ino, m.mapping}, gone);
}

TEST(StorageBooksTest, AKeptMappingIsTakenOnlyForItsMemfdAndSizeAndStaysBooked) {
  StorageBooks b;
  std::vector<std::shared_ptr<HostBuffer>> gone;
  Memfd a = MapNew(1 << 20), other = MapNew(1 << 20);
  BookAndKeep(b, a, gone);
  EXPECT_TRUE(gone.empty());
  std::lock_guard<std::mutex> lock(b.mu);
  EXPECT_EQ(b.TakeKeptLocked(other.dev, other.ino, 1 << 20), nullptr) << "another memfd";
  EXPECT_EQ(b.TakeKeptLocked(a.dev, a.ino, (1 << 20) - 4096), nullptr) << "another size";
  EXPECT_EQ(b.TakeKeptLocked(a.dev, a.ino, 1 << 20), a.mapping);
  // Taken, it is booked for the new buffer as it was for the released one.
  EXPECT_EQ(b.bytes, 1u << 20);
  EXPECT_EQ(b.buffers, 1u);
  EXPECT_EQ(b.kept_bytes, 0u);
  EXPECT_EQ(b.TakeKeptLocked(a.dev, a.ino, 1 << 20), nullptr) << "taken twice";
}

TEST(StorageBooksTest, KeptMappingsStayWithinTheClientPoolsBoundsOldestFirst) {
  StorageBooks b;
  std::vector<std::shared_ptr<HostBuffer>> gone;
  std::vector<Memfd> small;
  for (size_t i = 0; i <= StorageBooks::kKeptMappingsEntries; ++i) {
    small.push_back(MapNew(64 << 10));
    BookAndKeep(b, small.back(), gone);
  }
  // One more than the entries allowed: the first is unmapped and unbooked.
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0], small[0].mapping);
  {
    std::lock_guard<std::mutex> lock(b.mu);
    EXPECT_EQ(b.kept.size(), StorageBooks::kKeptMappingsEntries);
    EXPECT_EQ(b.buffers, StorageBooks::kKeptMappingsEntries);
    EXPECT_EQ(b.bytes, StorageBooks::kKeptMappingsEntries * (64u << 10));
    EXPECT_EQ(b.TakeKeptLocked(small[0].dev, small[0].ino, 64 << 10), nullptr);
  }
  // Three of 32 MiB are more than 64 MiB together: the older ones go until they fit.
  gone.clear();
  Memfd big[3] = {MapNew(32 << 20), MapNew(32 << 20), MapNew(32 << 20)};
  for (const Memfd& m : big) BookAndKeep(b, m, gone);
  std::lock_guard<std::mutex> lock(b.mu);
  EXPECT_LE(b.kept_bytes, StorageBooks::kKeptMappingsBytes);
  EXPECT_EQ(b.kept_bytes, 64u << 20) << "the two newest";
  EXPECT_EQ(b.bytes, b.kept_bytes);
  EXPECT_EQ(b.buffers, 2u);
  EXPECT_EQ(b.TakeKeptLocked(big[2].dev, big[2].ino, 32 << 20), big[2].mapping);
}

TEST(StorageBooksTest, DroppingKeptMappingsUnbooksThemAll) {
  StorageBooks b;
  std::vector<std::shared_ptr<HostBuffer>> gone;
  Memfd a = MapNew(1 << 20), c = MapNew(2 << 20);
  BookAndKeep(b, a, gone);
  BookAndKeep(b, c, gone);
  std::lock_guard<std::mutex> lock(b.mu);
  b.bytes += 4096;  // a live buffer's, not kept
  ++b.buffers;
  EXPECT_TRUE(b.DropKeptLocked(gone));
  EXPECT_EQ(gone.size(), 2u);
  EXPECT_EQ(b.bytes, 4096u);
  EXPECT_EQ(b.buffers, 1u);
  EXPECT_EQ(b.kept_bytes, 0u);
  EXPECT_FALSE(b.DropKeptLocked(gone)) << "nothing left to drop";
}

}  // namespace
}  // namespace gmux::daemon
