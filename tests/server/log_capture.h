// LogCapture: routes spdlog's default logger into a string for one test and
// puts the previous logger back (at level warn, the tests' default) when it
// goes out of scope.
//
// Test-only, header-only. Read text() once the daemon that logs is gone:
// the stream is not synchronized with writers beyond spdlog's own sink lock.
#ifndef KVHARBOR_TESTS_SERVER_LOG_CAPTURE_H_
#define KVHARBOR_TESTS_SERVER_LOG_CAPTURE_H_

#include <memory>
#include <sstream>
#include <string>

#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace kvharbor {
namespace testing {

class LogCapture {
 public:
  explicit LogCapture(spdlog::level::level_enum level)
      : saved_(spdlog::default_logger()) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>(
        "captured", std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)));
    spdlog::set_level(level);
  }
  ~LogCapture() {
    spdlog::set_default_logger(saved_);
    spdlog::set_level(spdlog::level::warn);
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;  // before the logger that writes into it
  std::shared_ptr<spdlog::logger> saved_;
};

}  // namespace testing
}  // namespace kvharbor

#endif  // KVHARBOR_TESTS_SERVER_LOG_CAPTURE_H_
