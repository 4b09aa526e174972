#include "common/sealed_memfd.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

namespace gmux {

bool KeepPassedDescriptor(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) return true;
  ::close(fd);
  return false;
}

Status CheckSealedMemfd(int fd, uint64_t bytes, const std::string& what,
                        const std::string& size_name) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return InvalidArgument(what + " must be a memfd sealed against shrinking");
  }
  struct statfs fs{};
  if (::fstatfs(fd, &fs) != 0 || fs.f_type == HUGETLBFS_MAGIC) {
    return InvalidArgument(what + " must not be on huge pages");
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0 || st.st_size < 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return InvalidArgument(what + " is smaller than " + size_name);
  }
  return Status::Ok();
}

}  // namespace gmux
