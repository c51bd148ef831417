// The HTTP transport of `lockstep serve`: cpp-httplib's Server with a deeper
// accept queue and its own connection loop, which gives every request a
// deadline for arriving whole. httplib's own loop only bounds each recv(), so
// a client that trickles one byte every few seconds would hold an HTTP worker
// for ever, and a few dozen such clients would stall every other request.
#pragma once

#include <httplib.h>

#include <string>

namespace lockstep::serve {

class HttpServer : public httplib::Server {
 public:
  // A request's line, headers and body must arrive within this many seconds
  // of its first byte, else the connection is closed (after a 408 when the
  // client is still there to read one). httplib's read and write timeouts
  // (5 s) still bound each single wait, and its keep-alive timeout (5 s) the
  // wait for the next request.
  void set_request_timeout(double seconds) { request_timeout_s_ = seconds; }
  // httplib 0.11 listens with a backlog of 5, so a burst of new connections
  // overflows it and clients wait for a SYN retransmit (1 s). listen() again
  // on the bound socket raises it to SOMAXCONN.
  bool widen_backlog();
  // On an HTTP worker: whether the request being answered ran past its
  // deadline (httplib then answers 400; the server turns that into 408).
  static bool request_timed_out();
  // What a 408 says.
  std::string timeout_message() const;

 private:
  // Serves one accepted connection (httplib calls this on a worker thread):
  // keep-alive requests one after another, each read under its deadline.
  bool process_and_close_socket(socket_t sock) override;
  // Waits up to the keep-alive timeout for the next request's first byte;
  // false when the connection was closed, went idle too long or the server
  // is stopping.
  bool wait_next_request(socket_t sock) const;

  double request_timeout_s_ = 30;
};

}  // namespace lockstep::serve
