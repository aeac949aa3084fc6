#pragma once
// A directory of numbered checkpoints: `save(step, a)` writes ckpt-<step>.dck atomically and keeps the
// newest `keep`; `load_latest()` returns the newest one that loads cleanly, so a file torn by a crash
// (or corrupted later) costs the steps since the one before it, never the run.
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
    auto all = steps();
    for (std::size_t i = static_cast<std::size_t>(keep_); i < all.size(); ++i)
      std::filesystem::remove(all[i].second, ec);  // best effort: an old file left behind is harmless
    return file;
  }

  // The newest checkpoint that loads cleanly, with its path; nothing if there is none.
  std::optional<std::pair<std::filesystem::path, archive>> load_latest_with_path() const {
    for (const auto& [step, file] : steps()) {
      try {
        return std::pair{file, checkpoint::load(file)};
      } catch (const checkpoint_error&) {
        // Torn or corrupt: fall back to the one before.
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
  std::filesystem::path dir_;
  int keep_;
};

}  // namespace distribute::checkpoint
