#pragma once
// summary::writer: scalars, images and text as a TensorBoard event file, with no protobuf or
// TensorFlow dependency (TFRecord framing, a hand-written encoder of the few messages, PNG through
// zlib). `tensorboard --logdir DIR` shows what a writer put in DIR.
//
//   summary::writer w("runs/exp1");               // runs/exp1/events.out.tfevents.<time>.<host>.<pid>.<n>
//   w.scalar("loss/total", loss, step);           // stored as float32
//   w.image("samples", step, height, width, 3, rgb);   // 8-bit rows of height x width x channels
//   w.text("config", "lr 2e-4, batch 8", step);   // shown by TensorBoard's Text tab (Markdown)
//
// The file starts with the version record TensorBoard expects ("brain.Event:2"). Records are
// buffered in memory and reach the file on flush(), when `flush_interval` has passed since the last
// write to the file (checked at each call), when `max_buffered` bytes are waiting, and in the
// destructor. A file is never fsync'd: a crash loses the records not yet written, and a record cut
// short by a kill is dropped by TensorBoard's reader (it stops at it).
//
// Multi-worker training: every worker runs the same steps and would write the same curves, so the
// chief alone writes, and the others hold a disabled writer, on which every call checks its
// arguments and does nothing else:
//
//   auto w = strategy.is_chief() ? summary::writer(dir) : summary::writer::disabled();
//
// Errors: a directory or file that cannot be created, or a write that fails (a full disk), throws
// summary_error naming the file and the system's reason. After a failed write the file is cut back
// to its last whole record, so it stays readable; the records of that write are lost and the writer
// carries on. Bad arguments throw std::invalid_argument naming what is wrong: an empty tag, a tag or
// text that is not UTF-8, an image of no pixels, channels other than 1, 3 or 4, a null pixel pointer.
//
// Thread safety: a writer holds a mutex, so threads (replicas of a mirrored strategy, a data loader)
// may call one writer at the same time; each record is written whole, in the order the calls take
// the mutex. Moving a writer, or destroying it, while another thread uses it is a race, as with any
// object. Two writers (in one process or in several) never share a file: each names its own.

#include <distribute/summary/detail/png.hpp>
#include <distribute/summary/detail/protobuf.hpp>
#include <distribute/summary/detail/tfrecord.hpp>
#include <distribute/summary/error.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace distribute::summary {

struct writer_options {
  // Buffered records are written to the file once this much time has passed since the last write.
  std::chrono::milliseconds flush_interval{10'000};
  // ... or once this many bytes are waiting.
  std::size_t max_buffered = std::size_t{1} << 20;
};

namespace detail {

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points above U+10FFFF):
// protobuf's string fields must be, or readers refuse the whole record.
inline bool valid_utf8(std::string_view s) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else return false;
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return false;
    for (std::size_t k = 2; k < len; ++k)
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    i += len;
  }
  return true;
}

inline void check_tag(std::string_view tag, const char* what) {
  if (tag.empty()) throw std::invalid_argument(std::string("summary::writer::") + what + ": the tag is empty");
  if (!valid_utf8(tag))
    throw std::invalid_argument(std::string("summary::writer::") + what + ": the tag '" + std::string(tag) +
                                "' is not valid UTF-8");
}

inline double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string h(buf);
  for (char& c : h)
    if (c == '/') c = '_';
  return h;
}

}  // namespace detail

class writer {
 public:
  static constexpr std::uint64_t max_image_bytes = std::uint64_t{1} << 30;

  // Creates `directory` (and its parents) if missing and a new events file in it, and writes the
  // version record to it. Throws summary_error naming the directory or the file.
  explicit writer(const std::filesystem::path& directory, writer_options options = {}) : s_{std::make_unique<state>()} {
    s_->options = options;
    std::error_code ec;
    std::filesystem::create_directories(directory, ec);
    if (ec) throw summary_error("distribute: cannot create the directory " + directory.string() + ": " + ec.message());
    static std::atomic<unsigned> counter{0};
    const auto seconds = static_cast<long long>(
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
    const std::string host = detail::host_name();
    for (int attempt = 0;; ++attempt) {
      s_->file = directory / ("events.out.tfevents." + std::to_string(seconds) + "." + host + "." +
                              std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)));
      s_->fd = ::open(s_->file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
      if (s_->fd >= 0) break;
      if (errno != EEXIST || attempt == 1000) failure("cannot create", errno);
    }
    try {
      detail::append_record(s_->buffer, detail::version_event(detail::wall_time_now()));
      write_buffer();  // TensorBoard lists the run as soon as the file holds its first record
    } catch (...) {
      ::unlink(s_->file.c_str());
      throw;
    }
  }

  // A writer that checks its arguments and writes nothing: for the workers other than the chief.
  static writer disabled() noexcept { return writer{}; }

  writer(writer&& other) noexcept = default;
  writer& operator=(writer&& other) noexcept {
    if (this != &other) {
      close_quietly();
      s_ = std::move(other.s_);
    }
    return *this;
  }
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;

  // Writes what is buffered and closes the file. An error here cannot be thrown: it is printed on
  // stderr (call close() first to have it thrown instead).
  ~writer() { close_quietly(); }

  bool enabled() const noexcept { return s_ != nullptr; }
  // The events file; empty for a disabled writer.
  std::filesystem::path file() const { return s_ ? s_->file : std::filesystem::path{}; }

  // `value` is stored as a float32 (TensorBoard's simple_value): rounded to the nearest float,
  // beyond float's range an infinity; NaN and infinities are kept.
  void scalar(std::string_view tag, double value, std::int64_t step) {
    detail::check_tag(tag, "scalar");
    if (!s_) return;
    constexpr double largest = std::numeric_limits<float>::max();
    const float v = value > largest    ? std::numeric_limits<float>::infinity()
                    : value < -largest ? -std::numeric_limits<float>::infinity()
                                       : static_cast<float>(value);
    add(step, detail::scalar_value(tag, v));
  }

  // An image of `height` rows of `width` pixels of `channels` bytes each (1: grey, 3: RGB, 4: RGBA),
  // row after row (HWC), stored as PNG.
  void image(std::string_view tag, std::int64_t step, int height, int width, int channels, const std::uint8_t* hwc) {
    detail::check_tag(tag, "image");
    auto where = [&] { return "summary::writer::image('" + std::string(tag) + "'): "; };
    if (height <= 0 || width <= 0)
      throw std::invalid_argument(where() + "an image of " + std::to_string(height) + "x" + std::to_string(width) +
                                  " pixels has none (height and width must be at least 1)");
    if (channels != 1 && channels != 3 && channels != 4)
      throw std::invalid_argument(where() + std::to_string(channels) + " channels (accepted: 1 grey, 3 RGB, 4 RGBA)");
    if (hwc == nullptr) throw std::invalid_argument(where() + "the pixels are a null pointer");
    // An event is a protobuf message, which readers take only below 2 GiB.
    const std::uint64_t bytes =
        static_cast<std::uint64_t>(height) * static_cast<std::uint64_t>(width) * static_cast<std::uint64_t>(channels);
    if (bytes > max_image_bytes)
      throw std::invalid_argument(where() + "an image of " + std::to_string(height) + "x" + std::to_string(width) +
                                  "x" + std::to_string(channels) +
                                  " bytes is too large (at most 1 GiB: an event must stay below 2 GiB)");
    if (!s_) return;
    const std::string png = detail::encode_png(height, width, channels, hwc);
    add(step, detail::image_value(tag, height, width, channels, png));
  }

  // Shown by TensorBoard's Text tab, which renders it as Markdown.
  void text(std::string_view tag, std::string_view text, std::int64_t step) {
    detail::check_tag(tag, "text");
    if (!detail::valid_utf8(text))
      throw std::invalid_argument("summary::writer::text('" + std::string(tag) + "'): the text is not valid UTF-8");
    if (!s_) return;
    add(step, detail::text_value(tag, text));
  }

  // Writes the buffered records to the file (the operating system's cache; not fsync'd).
  void flush() {
    if (!s_) return;
    std::lock_guard lock(s_->mutex);
    require_open();
    write_buffer();
  }

  // Flushes and closes the file. Throws summary_error when the last write or the close fails (the
  // file is closed either way). A second close() does nothing; any other call after it throws
  // summary_error.
  void close() {
    if (!s_) return;
    std::lock_guard lock(s_->mutex);
    if (s_->fd < 0) return;
    std::string error;
    try {
      write_buffer();
    } catch (const summary_error& e) {
      error = e.what();
    }
    if (::close(std::exchange(s_->fd, -1)) != 0 && error.empty()) error = message(*s_, "cannot close", errno);
    if (!error.empty()) throw summary_error(error);
  }

 private:
  struct state {
    std::mutex mutex;
    std::filesystem::path file;
    int fd = -1;
    std::string buffer;   // whole records not yet written
    ::off_t written = 0;  // the file's size after its last whole record
    std::chrono::steady_clock::time_point last_write{};
    writer_options options;

    state() = default;
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      if (fd >= 0) ::close(fd);
    }
  };

  writer() noexcept = default;

  static std::string message(const state& s, const char* what, int err) {
    return "distribute: " + std::string(what) + " the TensorBoard events file " + s.file.string() + ": " +
           std::strerror(err);
  }
  [[noreturn]] void failure(const char* what, int err) const { throw summary_error(message(*s_, what, err)); }

  void require_open() const {
    if (s_->fd < 0) throw summary_error("distribute: the TensorBoard events file " + s_->file.string() + " is closed");
  }

  void add(std::int64_t step, const detail::message& value) {
    const std::string event = detail::summary_event(detail::wall_time_now(), step, value);
    std::lock_guard lock(s_->mutex);
    require_open();
    detail::append_record(s_->buffer, event);
    if (s_->buffer.size() >= s_->options.max_buffered ||
        std::chrono::steady_clock::now() - s_->last_write >= s_->options.flush_interval)
      write_buffer();
  }

  void write_buffer() { write_buffer(*s_); }

  // Writes the buffer whole, or cuts the file back to its last whole record and throws.
  static void write_buffer(state& s) {
    std::string_view rest = s.buffer;
    while (!rest.empty()) {
      const ::ssize_t n = ::write(s.fd, rest.data(), rest.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        s.buffer.clear();
        [[maybe_unused]] const int cut =
            ::ftruncate(s.fd, s.written);  // if this fails too, readers stop at the torn record
        throw summary_error(message(s, "cannot write", err));
      }
      rest.remove_prefix(static_cast<std::size_t>(n));
    }
    s.written += static_cast<::off_t>(s.buffer.size());
    s.buffer.clear();
    s.last_write = std::chrono::steady_clock::now();
  }

  void close_quietly() noexcept {
    try {
      close();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "distribute: warning: %s (records lost)\n", e.what());
    }
  }

  std::unique_ptr<state> s_;
};

}  // namespace distribute::summary
