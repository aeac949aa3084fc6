#pragma once
// Checkpoints: named sections of training state (models, optimisers, step, data position, random
// engines) in a checksummed file written atomically, and a directory that keeps the newest few.
//
//   dist::checkpoint::archive a;
//   a.put("step", step);
//   a.put_model("generator", gen);
//   a.put_state("generator_opt", gen_opt);
//   a.put_text("rng", rng);
//   dist::checkpoint::directory{"ckpt"}.save(step, a);
//   ...
//   if (auto a = dist::checkpoint::directory{"ckpt"}.load_latest()) { a->get_model("generator", gen); ... }

#include <distribute/checkpoint/archive.hpp>
#include <distribute/checkpoint/directory.hpp>
#include <distribute/checkpoint/error.hpp>
#include <distribute/checkpoint/file.hpp>
