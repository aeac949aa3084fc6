#pragma once
// A directory of numbered checkpoints: `save(step, a)` writes ckpt-<step>.dck atomically and keeps the
// newest `keep`; `load_latest()` returns the newest one that loads cleanly, so a file torn by a crash
// (or corrupted later) costs the steps since the one before it, never the run. The newer files it
// skips are reported (a warning on stderr, or a list for the caller), and a directory whose every
// checkpoint fails to load is an error (no_loadable_checkpoint), not a fresh start: only a directory
// without checkpoint files gives nothing.
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
#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace distribute::checkpoint {

// A checkpoint file that did not load, and why (the load's checkpoint_error message).
struct skipped_file {
  std::filesystem::path file;
  std::string reason;
};

// A checkpoint directory holds checkpoint files and none of them loads. Resuming from it would start
// over at step 0 and lose the run without a word, so `directory::load_latest` throws this instead;
// the message names the directory and every file with why it failed. To start over on purpose, move
// the files away (or restore an intact copy).
struct no_loadable_checkpoint : checkpoint_error {
  no_loadable_checkpoint(std::filesystem::path where, std::vector<skipped_file> failed)
      : checkpoint_error(describe(where, failed)), dir{std::move(where)}, files{std::move(failed)} {}

  std::filesystem::path dir;
  std::vector<skipped_file> files;  // newest first

  // "ckpt-...dck: why", without the library's "distribute: " prefix, naming the file if `why` does not.
  static std::string line_of(const skipped_file& f) {
    std::string_view why = f.reason;
    if (why.starts_with("distribute: ")) why.remove_prefix(12);
    const auto name = f.file.string();
    return why.find(name) == std::string_view::npos ? name + ": " + std::string(why) : std::string(why);
  }

 private:
  static std::string describe(const std::filesystem::path& where, const std::vector<skipped_file>& failed) {
    std::string s = "distribute: no checkpoint in " + where.string() + " loads (" + std::to_string(failed.size()) +
                    " file" + (failed.size() == 1 ? "" : "s") +
                    "), so there is nothing to resume from; restore an intact checkpoint, or move these files away "
                    "to start from step 0:";
    for (const auto& f : failed) s += "\n  " + line_of(f);
    return s;
  }
};

class directory {
 public:
  using skipped_file = checkpoint::skipped_file;

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
    const distribute::detail::activity_scope<distribute::detail::activity::checkpoint> timed;  // with pruning
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec)
      throw checkpoint_error("distribute: cannot create checkpoint directory " + dir_.string() + ": " + ec.message());
    const auto file = dir_ / file_name(step);
    checkpoint::save(file, a);
    prune(step);
    remove_stale_temporaries();
    return file;
  }

  // Removes the temporaries of writers killed before their rename (see atomic_write.hpp); a program
  // calls this at start. Returns the files removed.
  std::vector<std::filesystem::path> remove_stale_temporaries() const {
    return checkpoint::remove_stale_temporaries(dir_);
  }

  // The newest checkpoint that loads cleanly, with its path; nothing if the directory holds no
  // checkpoint file (a fresh start). The newer files that did not load are appended to `skipped`
  // when it is given, else reported on stderr, one warning line each. If there are checkpoint files
  // and none of them loads, throws no_loadable_checkpoint (after appending them to `skipped`).
  std::optional<std::pair<std::filesystem::path, archive>> load_latest_with_path(
      std::vector<skipped_file>* skipped = nullptr) const {
    const distribute::detail::activity_scope<distribute::detail::activity::checkpoint> timed;
    std::vector<skipped_file> failed;
    for (const auto& [step, file] : steps()) {
      try {
        auto a = checkpoint::load(file);
        report(failed, skipped, file);
        return std::pair{file, std::move(a)};
      } catch (const checkpoint_error& e) {
        // Removed since it was listed (pruned by a concurrent save): not a damaged checkpoint.
        std::error_code ec;
        if (std::filesystem::symlink_status(file, ec).type() == std::filesystem::file_type::not_found) continue;
        // Torn or corrupt: fall back to the one before.
        failed.push_back({file, e.what()});
      }
    }
    if (failed.empty()) return std::nullopt;
    if (skipped) skipped->insert(skipped->end(), failed.begin(), failed.end());
    throw no_loadable_checkpoint(dir_, std::move(failed));
  }
  // The archive of load_latest_with_path.
  std::optional<archive> load_latest(std::vector<skipped_file>* skipped = nullptr) const {
    if (auto found = load_latest_with_path(skipped)) return std::move(found->second);
    return std::nullopt;
  }
  // The path of load_latest_with_path.
  std::optional<std::filesystem::path> latest(std::vector<skipped_file>* skipped = nullptr) const {
    if (auto found = load_latest_with_path(skipped)) return found->first;
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
  // The files skipped before `loaded`: to the caller's list, or a warning each on stderr.
  static void report(const std::vector<skipped_file>& failed, std::vector<skipped_file>* skipped,
                     const std::filesystem::path& loaded) {
    if (skipped) {
      skipped->insert(skipped->end(), failed.begin(), failed.end());
      return;
    }
    for (const auto& f : failed)
      std::fprintf(stderr, "distribute: warning: skipped a checkpoint that does not load (%s); loaded %s instead\n",
                   no_loadable_checkpoint::line_of(f).c_str(), loaded.string().c_str());
  }

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
