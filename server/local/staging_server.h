// StagingServer: the Unix domain socket where same-host clients register
// staging regions for Insert through shared memory (types/staging_wire.h,
// docs/operations.md "Same-host Insert").
//
// The daemon serves it at store.host_ipc_socket + ".stage" when it serves
// the host IPC socket (host pools in a shared arena), with the same file
// mode. A connection sends one StagingRegister with a memfd attached; the
// server checks it (magic and version, one descriptor, F_SEAL_SHRINK set so
// that the region can never shrink under the daemon's mapping, at least the
// announced bytes, at most max_region_bytes), maps it read-only, registers
// it in the StagingRegistry and answers with a StagingGrant (id, key). The
// connection then stays open: when it closes (the client unregisters, exits
// or crashes) the region is unregistered. Anything else a client sends, a
// register that does not arrive within register_timeout, or more than
// max_connections connections at once ends that connection, never another.
//
// Memory: owns its listener and connections; the registry must outlive it.
// Thread-safety: Start and Stop from one thread (the daemon's); one
// internal thread serves every connection. Stop is idempotent and also runs
// in the destructor; it unregisters every region it registered.
#ifndef KVHARBOR_SERVER_LOCAL_STAGING_SERVER_H_
#define KVHARBOR_SERVER_LOCAL_STAGING_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/local/staging_registry.h"
#include "server/local/unix_listener.h"

namespace kvharbor {

struct StagingServerOptions {
  std::string socket;           // the socket file's path
  uint32_t socket_mode = 0600;  // its permission bits
  // Connections open at once, registered or not; more are closed at once.
  size_t max_connections = 256;
  // Largest region one connection may register.
  uint64_t max_region_bytes = uint64_t{64} << 30;
  // A connection that has not registered by then is closed.
  absl::Duration register_timeout = absl::Seconds(5);
};

class StagingServer {
 public:
  static absl::StatusOr<std::unique_ptr<StagingServer>> Start(
      const StagingServerOptions& options, StagingRegistry* registry,
      uint64_t daemon_id);
  ~StagingServer();
  StagingServer(const StagingServer&) = delete;
  StagingServer& operator=(const StagingServer&) = delete;

  const std::string& path() const { return listener_->path(); }
  // Registrations granted so far.
  uint64_t granted() const { return granted_.load(); }
  void Stop();

 private:
  struct Conn {
    int fd = -1;
    uint64_t id = 0;  // 0 until registered
    absl::Time deadline;
  };

  StagingServer(std::unique_ptr<UnixListener> listener,
                StagingServerOptions options, StagingRegistry* registry,
                uint64_t daemon_id);
  void Loop();
  void AcceptOne();
  // Reads `c`'s register (or its end); false when `c` is done.
  bool OnReadable(Conn& c);
  // Registers the region of `fd` (taken over) for `req`; the grant to send.
  StagingGrant Register(const StagingRegister& req, int fd, uint64_t* id);
  void CloseConn(Conn& c);

  const std::unique_ptr<UnixListener> listener_;
  const StagingServerOptions options_;
  StagingRegistry* const registry_;
  const uint64_t daemon_id_;
  std::vector<Conn> conns_;  // the serving thread's alone
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> granted_{0};
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace kvharbor

#endif  // KVHARBOR_SERVER_LOCAL_STAGING_SERVER_H_
