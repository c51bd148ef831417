// The HTTP transport of `lockstep serve`: cpp-httplib's Server with a deeper
// accept queue and its own connection loop, which gives every request a
// deadline for arriving whole. httplib's own loop only bounds each recv(), so
// a client that trickles one byte every few seconds would hold an HTTP worker
// for ever, and a few dozen such clients would stall every other request.
#pragma once

#include <httplib.h>

#include <atomic>
#include <memory>
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
  // A request's line and headers must arrive within this many seconds of its
  // first byte (within the request timeout), else 408 and the connection is
  // closed. While accepted connections wait for a worker, a request whose
  // headers are incomplete gives its worker up sooner, after
  // kHeaderStallUnderLoadS without a byte: clients that send half a request
  // and stop then delay the others by a fraction of a second for each round
  // of workers they fill, not by the header timeout. (A client that keeps
  // trickling bytes is bound by the header timeout only: a slow but live
  // client is not cut off for the load others make.)
  void set_header_timeout(double seconds) { header_timeout_s_ = seconds; }
  static constexpr double kHeaderStallUnderLoadS = 0.25;
  // httplib 0.11 listens with a backlog of 5, so a burst of new connections
  // overflows it and clients wait for a SYN retransmit (1 s). listen() again
  // on the bound socket raises it to SOMAXCONN.
  bool widen_backlog();
  // On an HTTP worker: whether the request being answered ran past its
  // deadline (httplib then answers 400; the server turns that into 408).
  static bool request_timed_out();
  // On an HTTP worker: whether the client of the request being answered has
  // closed its end of the connection (a handler that waits long asks).
  static bool client_gone();
  // What a 408 says (on an HTTP worker: for the deadline that passed).
  std::string timeout_message() const;
  // The HTTP workers: `threads` of them, counting the accepted connections
  // that wait for one. Install it before listening:
  //   server.new_task_queue = [&] { return server.make_task_queue(n); };
  // While a connection waits, a connection idle between keep-alive requests
  // gives its worker up after kIdleUnderLoadS of idleness, and one that has
  // not sent its first request after kSilentUnderLoadS (both closed, as
  // nginx closes reusable connections when it runs short): idle and silent
  // clients then delay others by that much at most, not by the keep-alive
  // timeout.
  httplib::TaskQueue* make_task_queue(size_t threads);
  static constexpr double kIdleUnderLoadS = 0.25;
  static constexpr double kSilentUnderLoadS = 1.0;

 private:
  // Serves one accepted connection (httplib calls this on a worker thread):
  // keep-alive requests one after another, each read under its deadline.
  bool process_and_close_socket(socket_t sock) override;
  // Waits up to the keep-alive timeout for the next request's first byte
  // (`first`: the connection's first request); false when the connection was
  // closed, went idle too long, gave its worker up to a waiting connection
  // (make_task_queue) or the server is stopping.
  bool wait_next_request(socket_t sock, bool first) const;

  double request_timeout_s_ = 30;
  double header_timeout_s_ = 5;
  // Accepted connections not yet on a worker (make_task_queue's queue).
  std::shared_ptr<std::atomic<int64_t>> waiting_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace lockstep::serve
