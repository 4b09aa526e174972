// `gmux lease`: explicit leases on gmuxd's device pool (docs/operations.md, "Device pool").
#pragma once

#include <optional>
#include <string>

namespace gmux::cli {

struct LeaseOptions {
  std::string socket;    // empty: $GMUX_SOCKET or the default
  std::string tenant;    // acquire: another tenant (root and admin_uids only)
  std::string for_text;  // acquire: how long it is held ("" or "0": until released)
  std::string wait_text; // acquire: how long to wait for a device ("": not at all)
  std::string id;        // release: "L<n>" or "<n>"
  int device = -1;       // acquire: that pool device (gmuxd's index, as `gmux lease list` shows)
  bool json = false;
};

// "90", "90s", "500ms", "5m", "2h", "1d" in seconds; nullopt when it is none of these.
std::optional<double> ParseDuration(const std::string& text);

int RunLeaseAcquire(const LeaseOptions& o);
int RunLeaseRelease(const LeaseOptions& o);
int RunLeaseList(const LeaseOptions& o);

}  // namespace gmux::cli
