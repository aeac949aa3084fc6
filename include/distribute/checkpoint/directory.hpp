#pragma once
// A directory of numbered checkpoints: `save(step, a)` writes ckpt-<step>.dck atomically and keeps the
// newest `keep`; `load_latest()` returns the newest one that loads cleanly, so a file torn by a crash
// (or corrupted later) costs the steps since the one before it, never the run.
//
// Pruning counts only checkpoints that load: a corrupt file is removed rather than kept in place of a
// good one, and the file just written is never pruned (a directory full of corrupt higher-numbered
// files must not make every new checkpoint vanish as soon as it is written). Checkpoints of steps
// after the one just saved belong to another history (a run restarted from an earlier step); they
// are left alone when intact. `save` also removes temporaries that a killed writer left behind.
//
// In a multi-worker job only the chief saves; every worker may load.

#include <distribute/checkpoint/archive.hpp>
#include <distribute/checkpoint/file.hpp>

#include <algorithm>
#include <charconv>
#include <functional>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace distribute::checkpoint {

class directory {
 public:
  explicit directory(std::filesystem::path dir, int keep = 3) : dir_{std::move(dir)}, keep_{keep} {
    if (keep_ < 1) throw std::invalid_argument("distribute: a checkpoint directory must keep at least one checkpoint");
  }

  const std::filesystem::path& path() const noexcept { return dir_; }

  static std::string file_name(std::int64_t step) {
    if (step < 0) throw std::invalid_argument("distribute: checkpoint step must not be negative");
    std::string digits = std::to_string(step);
    if (digits.size() < 10) digits.insert(0, 10 - digits.size(), '0');
    return "ckpt-" + digits + ".dck";
  }

  std::filesystem::path save(std::int64_t step, const archive& a) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw checkpoint_error("distribute: cannot create checkpoint directory " + dir_.string() + ": " + ec.message());
    const auto file = dir_ / file_name(step);
    checkpoint::save(file, a);
    prune(step);
    remove_stale_temporaries();
    return file;
  }

  // Removes the temporaries of writers killed before their rename (see atomic_write.hpp); a program
  // calls this at start. Returns the files removed.
  std::vector<std::filesystem::path> remove_stale_temporaries() const { return checkpoint::remove_stale_temporaries(dir_); }

  // A checkpoint file that did not load, and why.
  struct skipped_file {
    std::filesystem::path file;
    std::string reason;
  };

  // The newest checkpoint that loads cleanly, with its path; nothing if there is none. The newer
  // files that did not load are appended to `skipped` when it is given.
  std::optional<std::pair<std::filesystem::path, archive>> load_latest_with_path(std::vector<skipped_file>* skipped = nullptr) const {
    for (const auto& [step, file] : steps()) {
      try {
        return std::pair{file, checkpoint::load(file)};
      } catch (const checkpoint_error& e) {
        // Torn or corrupt: fall back to the one before.
        if (skipped) skipped->push_back({file, e.what()});
      }
    }
    return std::nullopt;
  }
  std::optional<archive> load_latest() const {
    if (auto found = load_latest_with_path()) return std::move(found->second);
    return std::nullopt;
  }
  std::optional<std::filesystem::path> latest() const {
    if (auto found = load_latest_with_path()) return found->first;
    return std::nullopt;
  }

  // (step, file) of every checkpoint file here, newest first.
  std::vector<std::pair<std::int64_t, std::filesystem::path>> steps() const {
    std::vector<std::pair<std::int64_t, std::filesystem::path>> out;
    std::error_code ec;
    if (!std::filesystem::is_directory(dir_, ec)) return out;
    for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
      const auto name = entry.path().filename().string();
      if (name.size() <= 9 || !name.starts_with("ckpt-") || !name.ends_with(".dck")) continue;
      std::int64_t step = 0;
      const char* first = name.data() + 5;
      const char* last = name.data() + name.size() - 4;
      const auto [ptr, err] = std::from_chars(first, last, step);
      if (err != std::errc{} || ptr != last) continue;
      out.emplace_back(step, entry.path());
    }
    std::ranges::sort(out, std::greater<>{});
    return out;
  }

 private:
  // Keeps the checkpoint of `saved` and the newest keep - 1 intact ones before it; removes older and
  // corrupt ones. Best effort: a file that cannot be removed is harmless.
  void prune(std::int64_t saved) const {
    std::error_code ec;
    int kept = 1;  // the one just written
    for (const auto& [step, file] : steps()) {
      if (step == saved) continue;
      bool intact = true;
      try {
        (void)checkpoint::load(file);
      } catch (const checkpoint_error&) {
        intact = false;
      }
      if (!intact) std::filesystem::remove(file, ec);
      else if (step > saved) continue;  // another history's: not ours to prune
      else if (kept < keep_) ++kept;
      else std::filesystem::remove(file, ec);
    }
  }

  std::filesystem::path dir_;
  int keep_;
};

}  // namespace distribute::checkpoint
