#pragma once
// What a restart of a two-network GAN example needs, saved and restored for preemption_checkpoint
// (examples/conditional_gan, examples/pix2pix): the generator and the discriminator, their
// optimisers' states, the random engine that draws the data (and noise), and the seconds trained.
// Saved from replica 0; restored there and broadcast to every replica.
//
//   gan_checkpoint state{strategy, gens, discs, g_opts, d_opts, rng, elapsed, before};
//   preemption.emplace(strategy, dir, state.saver(), state.restorer(), options);

#include <distribute/checkpoint.hpp>

#include <span>
#include <sstream>
#include <string>

namespace examples {

template <class S, class Gens, class Discs, class GOpts, class DOpts, class Rng, class Elapsed>
struct gan_checkpoint {
  S& strategy;
  Gens& gens;
  Discs& discs;
  GOpts& g_opts;
  DOpts& d_opts;
  Rng& rng;
  Elapsed elapsed;  // seconds trained so far, this run's included
  double& before;   // seconds trained before this run: set on restore

  void save(distribute::checkpoint::archive& a) const {
    a.put_model("generator", gens[0]);
    a.put_model("discriminator", discs[0]);
    a.put_state("generator_adam", g_opts[0]);
    a.put_state("discriminator_adam", d_opts[0]);
    std::ostringstream engine;
    engine << rng;
    const std::string text = engine.str();
    a.put_bytes("rng", std::as_bytes(std::span(text)));
    a.put("seconds", elapsed());
  }
  void restore(const distribute::checkpoint::archive& a) const {
    a.get_model("generator", gens[0]);
    a.get_model("discriminator", discs[0]);
    a.get_state("generator_adam", g_opts[0]);
    a.get_state("discriminator_adam", d_opts[0]);
    strategy.broadcast(gens, 0);
    strategy.broadcast(discs, 0);
    strategy.broadcast(g_opts, 0);
    strategy.broadcast(d_opts, 0);
    const auto text = a.bytes("rng");
    std::istringstream engine(std::string(reinterpret_cast<const char*>(text.data()), text.size()));
    engine >> rng;
    before = a.get<double>("seconds");
  }
  auto saver() const {
    return [this](distribute::checkpoint::archive& a) { save(a); };
  }
  auto restorer() const {
    return [this](const distribute::checkpoint::archive& a) { restore(a); };
  }
};

template <class S, class Gens, class Discs, class GOpts, class DOpts, class Rng, class Elapsed>
gan_checkpoint(S&, Gens&, Discs&, GOpts&, DOpts&, Rng&, Elapsed, double&)
    -> gan_checkpoint<S, Gens, Discs, GOpts, DOpts, Rng, Elapsed>;

}  // namespace examples
