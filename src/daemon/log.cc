#include "daemon/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace gmux::daemon {

void InitLog(std::string_view program, const std::string& level) {
  const std::string name(program);
  auto logger = spdlog::get(name);
  if (!logger) {
    logger = spdlog::stderr_logger_mt(name);
    // The time, the program and its pid, the level: what an operator greps for.
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %n[%P] %l: %v");
    logger->flush_on(spdlog::level::debug);
    spdlog::set_default_logger(logger);
  }
  spdlog::level::level_enum l = spdlog::level::info;
  if (level == "debug") l = spdlog::level::debug;
  if (level == "warn") l = spdlog::level::warn;
  if (level == "error") l = spdlog::level::err;
  logger->set_level(l);
}

}  // namespace gmux::daemon
