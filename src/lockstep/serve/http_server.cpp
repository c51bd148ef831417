// HttpServer's connection loop: a socket Stream whose reads stop at the
// request's deadline, and the keep-alive loop that httplib's
// process_server_socket would run, with that deadline added.
#include "lockstep/serve/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "lockstep/serve/protocol.h"

namespace lockstep::serve {

namespace {

using Clock = std::chrono::steady_clock;

int to_ms(double seconds) {
  return int(std::clamp(seconds * 1000.0, 0.0, 1e9));
}

// poll() one socket for `events`, retrying on EINTR: > 0 ready, 0 timed out, < 0 error.
int wait_for(socket_t sock, short events, int timeout_ms) {
  pollfd p{sock, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r > 0 && (p.revents & (POLLERR | POLLNVAL))) return -1;
    return r;
  }
}

void address_of(socket_t sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int r = peer ? getpeername(sock, reinterpret_cast<sockaddr*>(&addr), &len)
                     : getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len);
  if (r != 0) return;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

double seconds(time_t sec, time_t usec) {
  return double(sec) + double(usec) * 1e-6;
}

// Which deadline cut a request off.
enum class Cutoff { None, Request, Header };

// What the stream needs to know about the server: whether it still listens
// (a stopping server does not wait for slow clients) and how many accepted
// connections wait for a worker.
struct ServerState {
  const std::atomic<socket_t>* listening = nullptr;
  const std::atomic<int64_t>* waiting = nullptr;
};

// A connected socket as httplib's Stream. Reads are buffered (httplib reads
// the request line and headers a byte at a time) and fail once the current
// request's deadline has passed (its header deadline, until the blank line
// that ends the headers has been read); each single read or write waits
// read_s or write_s at most.
class DeadlineStream : public httplib::Stream {
 public:
  struct Timeouts {
    double read_s, write_s, request_s, header_s;
  };
  DeadlineStream(socket_t sock, Timeouts t, ServerState server) : sock_(sock), t_(t), server_(server) {}

  // The next request begins now: it has request_s to arrive, header_s for its headers.
  void start_request() {
    cutoff_ = Cutoff::None;
    start_ = Clock::now();
    deadline_ = start_ + std::chrono::milliseconds(to_ms(t_.request_s));
    header_deadline_ = start_ + std::chrono::milliseconds(to_ms(std::min(t_.header_s, t_.request_s)));
    headers_done_ = false;
    tail_ = 0;
  }
  bool timed_out() const { return cutoff_ != Cutoff::None; }
  Cutoff cutoff() const { return cutoff_; }
  bool has_buffered() const { return off_ < len_; }

  bool is_readable() const override { return has_buffered() || wait_readable() > 0; }
  bool is_writable() const override {
    if (wait_for(sock_, POLLOUT, to_ms(t_.write_s)) <= 0) return false;
    return !peer_closed();
  }
  // A peer that has closed its end reads as end of file: nobody to write to.
  bool peer_closed() const {
    if (wait_for(sock_, POLLIN, 0) == 0) return false;
    char c;
    const ssize_t n = ::recv(sock_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (!has_buffered()) {
      if (wait_readable() <= 0) return -1;
      ssize_t n;
      do {
        n = ::recv(sock_, buf_, sizeof buf_, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      off_ = 0;
      len_ = size_t(n);
    }
    const size_t k = std::min(size, len_ - off_);
    std::memcpy(ptr, buf_ + off_, k);
    note_header_bytes(buf_ + off_, k);
    off_ += k;
    return ssize_t(k);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (wait_for(sock_, POLLOUT, to_ms(t_.write_s)) <= 0) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(sock_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(sock_, false, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  // The headers end at the first empty line ("\r\n\r\n", or "\n\n"): bytes
  // handed to httplib are scanned until then (the body is not).
  void note_header_bytes(const char* p, size_t n) {
    for (size_t i = 0; i < n && !headers_done_; ++i) {
      const char c = p[i];
      if (c == '\n') {
        headers_done_ = tail_ == 1;  // only "\r" (or nothing) since the last newline
        tail_ = 1;
      } else if (c == '\r' && tail_ == 1) {
        tail_ = 1;
      } else {
        tail_ = 2;
      }
    }
  }

  // Waits for data until the soonest of read_s, the request's deadline and,
  // while the headers are incomplete, the header deadline (and, while
  // connections wait for a worker, kHeaderStallUnderLoadS). Polls in short slices so that a stopping
  // server or a queue of waiting connections is noticed.
  int wait_readable() const {
    const auto begin = Clock::now();
    const auto read_until = begin + std::chrono::milliseconds(to_ms(t_.read_s));
    for (;;) {
      const auto now = Clock::now();
      auto until = deadline_;
      Cutoff reason = Cutoff::Request;
      if (!headers_done_ && header_deadline_ < until) {
        until = header_deadline_;
        reason = Cutoff::Header;
      }
      if (!headers_done_ && server_.waiting->load() > 0) {
        const auto stall = begin + std::chrono::milliseconds(to_ms(HttpServer::kHeaderStallUnderLoadS));
        if (stall < until) {
          until = stall;
          reason = Cutoff::Header;
        }
      }
      if (now >= until) {
        cutoff_ = reason;
        return 0;
      }
      if (now >= read_until) return 0;
      if (server_.listening->load() == INVALID_SOCKET) return -1;  // stopping: no more waiting
      const auto next = std::min({until, read_until, now + std::chrono::milliseconds(50)});
      const int ms =
          std::max(1, int(std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count()));
      const int r = wait_for(sock_, POLLIN, ms);
      if (r != 0) return r;
    }
  }

  socket_t sock_;
  Timeouts t_;
  ServerState server_;
  Clock::time_point start_ = Clock::now(), deadline_ = start_, header_deadline_ = start_;
  mutable Cutoff cutoff_ = Cutoff::None;
  bool headers_done_ = false;
  int tail_ = 0;  // header scan: 1 right after a newline (a "\r" may follow), else 2
  char buf_[4096];
  size_t off_ = 0, len_ = 0;
};

// The stream of the connection this HTTP worker serves (error handlers ask it).
thread_local const DeadlineStream* tl_stream = nullptr;

// httplib's thread pool, counting the connections queued for a worker.
class CountingPool : public httplib::TaskQueue {
 public:
  CountingPool(size_t threads, std::shared_ptr<std::atomic<int64_t>> waiting)
      : pool_(threads), waiting_(std::move(waiting)) {}
  void enqueue(std::function<void()> fn) override {
    waiting_->fetch_add(1);
    pool_.enqueue([w = waiting_, fn = std::move(fn)] {
      w->fetch_sub(1);
      fn();
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
  std::shared_ptr<std::atomic<int64_t>> waiting_;
};

}  // namespace

httplib::TaskQueue* HttpServer::make_task_queue(size_t threads) {
  return new CountingPool(threads, waiting_);
}

bool HttpServer::widen_backlog() {
  const socket_t fd = svr_sock_;
  return fd != INVALID_SOCKET && ::listen(fd, SOMAXCONN) == 0;
}

bool HttpServer::wait_next_request(socket_t sock, bool first) const {
  // In steps, so that a stopping server (its socket closed) does not wait out
  // the idle time of every keep-alive connection, and so that a connection
  // waiting for a worker is noticed.
  const auto start = Clock::now();
  const auto until = start + std::chrono::seconds(keep_alive_timeout_sec_);
  const auto yield_after =
      start + std::chrono::milliseconds(to_ms(first ? kSilentUnderLoadS : kIdleUnderLoadS));
  while (svr_sock_ != INVALID_SOCKET) {
    const int r = wait_for(sock, POLLIN, 50);
    if (r != 0) return r > 0;
    const auto now = Clock::now();
    if (now >= until) return false;
    if (now >= yield_after && waiting_->load() > 0) return false;
  }
  return false;
}

bool HttpServer::request_timed_out() {
  return tl_stream != nullptr && tl_stream->timed_out();
}

bool HttpServer::client_gone() {
  return tl_stream != nullptr && tl_stream->peer_closed();
}

std::string HttpServer::timeout_message() const {
  std::ostringstream os;
  if (tl_stream != nullptr && tl_stream->cutoff() == Cutoff::Header) {
    os << "the request line and headers did not arrive in time (--header-timeout " << header_timeout_s_
       << " s from the first byte; " << kHeaderStallUnderLoadS
       << " s without a byte while other connections wait for a worker)";
  } else {
    os << "the request did not arrive whole within " << request_timeout_s_
       << " s of its first byte (see --request-timeout)";
  }
  return os.str();
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  const DeadlineStream::Timeouts timeouts{seconds(read_timeout_sec_, read_timeout_usec_),
                                          seconds(write_timeout_sec_, write_timeout_usec_),
                                          request_timeout_s_, header_timeout_s_};
  DeadlineStream strm(sock, timeouts, ServerState{&svr_sock_, waiting_.get()});
  tl_stream = &strm;
  bool ok = false;
  for (size_t left = std::max<size_t>(1, keep_alive_max_count_); left > 0; --left) {
    const bool first = left == std::max<size_t>(1, keep_alive_max_count_);
    if (!strm.has_buffered() && !wait_next_request(sock, first)) break;
    strm.start_request();
    bool closed = false;
    ok = process_request(strm, /*close_connection=*/left == 1, closed, nullptr);
    if (!ok && strm.timed_out()) {
      // Cut off inside the request line: httplib has no request to answer,
      // so the 408 is written here (past the line, the error handler does).
      const std::string body = error_body(408, timeout_message(), "invalid_request_error").dump();
      std::ostringstream os;
      os << "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: "
         << body.size() << "\r\nConnection: close\r\n\r\n"
         << body;
      const std::string answer = os.str();
      strm.write(answer.data(), answer.size());
    }
    if (!ok || closed || strm.timed_out()) break;
  }
  tl_stream = nullptr;
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace lockstep::serve
