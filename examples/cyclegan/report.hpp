#pragma once
// The training log: a progress bar (a redrawn line on a terminal, a line every few percent
// otherwise), the CSV of losses per step, and the loss plot drawn from it.

#include "pictures.hpp"
#include "trainer.hpp"

#include <distribute/checkpoint/atomic_write.hpp>
#include <distribute/step_timings.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace cyclegan {

struct csv_row {
  std::int64_t step = 0;
  int epoch = 0;
  double lr = 0;
  step_losses l;
  double images_per_s = 0;
};

inline const char* csv_header = "step,epoch,lr,d_a,d_b,gan_ab,gan_ba,cycle,identity,images_per_s";

// Reads the rows of an earlier run up to and including `last_step` (a resumed run continues the file
// from its checkpoint; rows of steps after it were not part of the resumed history).
// A row that does not parse whole (ten fields, nothing after them) is skipped, as is a repeated step.
inline std::vector<csv_row> read_csv(const std::filesystem::path& file, std::int64_t last_step) {
  std::vector<csv_row> rows;
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    csv_row r;
    char c[9] = {};
    std::istringstream ls(line);
    ls >> r.step >> c[0] >> r.epoch >> c[1] >> r.lr >> c[2] >> r.l.d_a >> c[3] >> r.l.d_b >> c[4] >> r.l.gan_ab >>
        c[5] >> r.l.gan_ba >> c[6] >> r.l.cycle >> c[7] >> r.l.identity >> c[8] >> r.images_per_s;
    const bool commas = std::all_of(std::begin(c), std::end(c), [](char k) { return k == ','; });
    if (!ls || !commas || !(ls >> std::ws).eof()) continue;
    if (r.step <= last_step && (rows.empty() || r.step > rows.back().step)) rows.push_back(r);
  }
  return rows;
}

// Whether `rows` hold steps 1 to `last_step`, each once.
inline bool continuous(const std::vector<csv_row>& rows, std::int64_t last_step) {
  if (rows.size() != static_cast<std::size_t>(last_step)) return false;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].step != static_cast<std::int64_t>(i) + 1) return false;
  return true;
}

// Rewrites the whole file atomically (written beside it, flushed, renamed over it): a crash leaves
// the previous version or this one, never a truncated file.
inline void write_csv(const std::filesystem::path& file, const std::vector<csv_row>& rows) {
  std::string out = std::string(csv_header) + '\n';
  for (const auto& r : rows) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%lld,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.4g\n", static_cast<long long>(r.step),
                  r.epoch, r.lr, r.l.d_a, r.l.d_b, r.l.gan_ab, r.l.gan_ba, r.l.cycle, r.l.identity, r.images_per_s);
    out += buf;
  }
  distribute::checkpoint::write_atomically(file, out);
}

// Two panels: the weighted cycle and identity losses, which dominate the total, above the adversarial
// losses, which would be flat lines on the same scale.
inline image plot_losses(const std::vector<csv_row>& rows) {
  std::vector<curve> recon{{"cycle", {}, {148, 103, 189}}, {"identity", {}, {140, 86, 75}}};
  std::vector<curve> gan{{"D_A", {}, {31, 119, 180}},
                         {"D_B", {}, {255, 127, 14}},
                         {"G_AB gan", {}, {44, 160, 44}},
                         {"G_BA gan", {}, {214, 39, 40}}};
  for (const auto& r : rows) {
    recon[0].values.push_back(r.l.cycle);
    recon[1].values.push_back(r.l.identity);
    gan[0].values.push_back(r.l.d_a);
    gan[1].values.push_back(r.l.d_b);
    gan[2].values.push_back(r.l.gan_ab);
    gan[3].values.push_back(r.l.gan_ba);
  }
  return stack_vertically(
      {plot_curves(recon, "CycleGAN: weighted cycle and identity losses (moving average)", 800, 300),
       plot_curves(gan, "LSGAN losses of the discriminators and generators (moving average)", 800, 300)});
}

inline std::string clock_string(double seconds) {
  const auto s = static_cast<long long>(seconds < 0 ? 0 : seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%02lld:%02lld", s / 60, s % 60);
  return buf;
}

// A step_timings with every part scaled by `f` (a decaying window of steps).
inline distribute::step_timings decayed(const distribute::step_timings& t, double f) {
  return {t.wall * f, t.compute * f, t.collective * f, t.input_wait * f, t.checkpoint * f, t.runs};
}

// "compute 81.2%, collectives 12.0%, input wait 0.4%, checkpoints 1.1%, other 5.3% of 2:01".
inline std::string time_breakdown(const distribute::step_timings& t) {
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "compute %.1f%%, collectives %.1f%%, input wait %.1f%%, checkpoints %.1f%%, other %.1f%% of %s",
                100 * t.share(t.compute), 100 * t.share(t.collective), 100 * t.share(t.input_wait),
                100 * t.share(t.checkpoint), 100 * t.share(t.other()), clock_string(t.wall).c_str());
  return buf;
}

class progress_bar {
 public:
  progress_bar(std::int64_t total, std::int64_t first, bool quiet)
      : total_{total}, first_{first}, quiet_{quiet}, tty_{isatty(2) == 1}, start_{std::chrono::steady_clock::now()} {}

  void update(std::int64_t step, int epoch, int epochs, double images_per_s, const step_losses& l,
              const distribute::step_timings& t) {
    if (quiet_) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double per_step = elapsed / static_cast<double>(std::max<std::int64_t>(1, step - first_));
    const double eta = per_step * static_cast<double>(total_ - step);
    const int width = 24, done = static_cast<int>(width * step / std::max<std::int64_t>(1, total_));
    char line[400];
    std::snprintf(line, sizeof line,
                  "epoch %d/%d step %lld/%lld [%s%s] %.1f img/s  D %.3f/%.3f  G %.3f/%.3f  cyc %.3f  idt %.3f  "
                  "time: compute %.0f%% comm %.0f%% input %.0f%% ckpt %.0f%%  ETA %s",
                  epoch + 1, epochs, static_cast<long long>(step), static_cast<long long>(total_),
                  std::string(static_cast<std::size_t>(done), '#').c_str(),
                  std::string(static_cast<std::size_t>(width - done), '.').c_str(), images_per_s, l.d_a, l.d_b,
                  l.gan_ab, l.gan_ba, l.cycle, l.identity, 100 * t.share(t.compute), 100 * t.share(t.collective),
                  100 * t.share(t.input_wait), 100 * t.share(t.checkpoint), clock_string(eta).c_str());
    if (tty_) {
      std::fprintf(stderr, "\r%s\033[K", line);
      if (step == total_) std::fprintf(stderr, "\n");
    } else if (step == total_ || step % std::max<std::int64_t>(1, total_ / 20) == 0) {
      std::fprintf(stderr, "%s\n", line);
    }
  }
  // A line of its own (a picture written, a checkpoint saved), without breaking the bar.
  void note(const std::string& s) const {
    if (quiet_) return;
    std::fprintf(stderr, tty_ ? "\r%s\033[K\n" : "%s\n", s.c_str());
  }

 private:
  std::int64_t total_, first_;
  bool quiet_, tty_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace cyclegan
