#pragma once
// The CycleGAN training step, written once against the strategy concept, in the three placements of
// selective mirroring:
//
//   full                every block mirrored: each replica translates its share of the batch,
//                       gradients are summed across replicas. The fakes are gathered onto the
//                       primary for the image pool and the pool's answer is scattered back.
//   discriminator_only  the generators' forward, backward and update run once, on the primary, over
//                       the whole global batch (their adversarial loss uses the primary's copy of
//                       the discriminators); the real and pooled fake images are scattered and the
//                       discriminators' update is mirrored.
//   conditional         full when the global batch is at least `mirror_threshold` (the
//                       communication then pays for itself), else the whole step on the primary
//                       followed by a broadcast of the changed state.
//
// What must agree: every loss is this replica's share of the mean over the GLOBAL batch and the
// gradients are summed, the image pool sees the global batch in order, and every layer is per example
// (instance norm; or sync_batch_norm). So after any step, the four networks and their optimiser states
// are the same in all three placements and under one device, up to float rounding of the gradient
// sums (the `placement` test checks 1e-4 relative after 3 steps). With plain batch norm they are not:
// each replica normalises its share with its own statistics.
//
// The device is the strategy's: on GPU replicas the networks, their optimisers' state and every
// tensor of the step live on the replica's GPU. What crosses to the host is what the host needs: the
// global batch comes from the input pipeline as host images and each replica uploads its share; the
// fakes come down for the image pool, the losses as numbers, the pictures' translations as images.

#include "classifier.hpp"
#include "data.hpp"
#include "image_pool.hpp"
#include "models.hpp"

#include <distribute/checkpoint.hpp>
#include <distribute/distribute.hpp>
#include <distribute/strategy/placement.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cyclegan {

namespace optim = distribute::optim;
namespace ckpt = distribute::checkpoint;
using adam = optim::adam<float>;

enum class placement { full, discriminator_only, conditional };

inline placement parse_placement(const std::string& s) {
  if (s == "full") return placement::full;
  if (s == "discriminator_only") return placement::discriminator_only;
  if (s == "conditional") return placement::conditional;
  throw std::invalid_argument("--placement must be full, discriminator_only or conditional, not '" + s + "'");
}
inline const char* name_of(placement p) {
  return p == placement::full ? "full" : p == placement::discriminator_only ? "discriminator_only" : "conditional";
}

struct train_options {
  generator_options gen{};
  discriminator_options disc{};
  int batch = 4;  // per replica; the global batch is batch x replicas
  double lr = 2e-4, beta1 = 0.5, beta2 = 0.999;
  double lambda_cycle = 10.0;
  double lambda_identity = 0.5;  // times lambda_cycle: the reference's identity weight 5
  std::size_t pool_size = 50;
  std::int64_t total_steps = 1;  // the schedule's length
  double decay_fraction = 0.5;   // the learning rate decays linearly to 0 over this last part
  bool scale_lr = false;         // lr x replicas (Goyal et al.), reached by a linear warm-up
  std::int64_t warmup_steps = 0;
  placement place = placement::full;
  std::size_t mirror_threshold = 16;  // conditional: mirror when the global batch is at least this
  std::uint64_t seed = 1;
  // Each network's gradient all-reduce overlapped with the backward that finishes it (the same bits
  // as after it: replica_context::overlap_gradients).
  bool overlap = true;
  // What the gradients travel as between replicas (gradient_compression::bfloat16: half the bytes,
  // bfloat16's precision; every replica still holds the same bits).
  dist::gradient_compression compression = dist::gradient_compression::none;
  // GPU replicas: each network's forward and backward replayed as CUDA graphs (nn::graphed; the same
  // bits as eager). Refused on the CPU.
  bool graphs = false;
};

// How the networks of device D are held: as built, or, on GPU replicas (graphs.cuh, included by the
// CUDA units), in nn::graphed, which replays their passes as CUDA graphs when `graphs` is on.
template <class D, class M>
struct network_holder {
  using type = M;
  static type hold(M m, bool /*graphs*/) { return m; }
};

// Losses of one step: each the mean over the global batch.
struct step_losses {
  double d_a = 0, d_b = 0;         // LSGAN discriminator losses (0.5 (real + fake))
  double gan_ab = 0, gan_ba = 0;   // generators' adversarial losses
  double cycle = 0, identity = 0;  // weighted, both directions
  step_losses& operator+=(const step_losses& o) {
    d_a += o.d_a, d_b += o.d_b, gan_ab += o.gan_ab, gan_ba += o.gan_ba, cycle += o.cycle, identity += o.identity;
    return *this;
  }
  std::vector<double> values() const { return {d_a, d_b, gan_ab, gan_ba, cycle, identity}; }
  static step_losses from(const std::vector<double>& v) {
    return {v.at(0), v.at(1), v.at(2), v.at(3), v.at(4), v.at(5)};
  }
  double generator_total() const { return gan_ab + gan_ba + cycle + identity; }
};

// k t and t += u, computed by the replica's engine.
template <class R, class T>
T scaled(R& r, T t, double k) {
  r.engine().for_each(static_cast<std::int64_t>(t.size()),
                      dist::detail::kernels::scale<float>{t.data(), t.data(), static_cast<float>(k)});
  return t;
}
template <class R, class T>
void add_to(R& r, T& t, const T& u) {
  r.engine().for_each(static_cast<std::int64_t>(t.size()), dist::detail::kernels::add_to<float>{t.data(), u.data()});
}
template <class T>
T filled_like(const T& t, float v) {
  T out{t.shape(), t.device()};
  out.fill(v);
  return out;
}

// What a generator block hands on: its losses and the fakes for the discriminators, on the replica's
// device.
template <class D>
struct generator_result {
  step_losses losses;
  dist::tensor<float, D> fake_a, fake_b;
};

// How a step routes its gradients: wired by hand (each network's backward right after its forward,
// the gradients added where they meet), or recorded on an nn::tape, which routes them (the same
// gradients, bit for bit: see taped_generator_step). benchmarks/bench_tape.cpp times one beside the
// other.
enum class wiring { by_hand, tape };

template <distribute::strategy S, wiring W = wiring::by_hand>
class trainer {
 public:
  // The strategy's device, and the networks and tensors on it.
  using device_type = typename S::device_type;
  using device_tensor = dist::tensor<float, device_type>;
  using device_loss = nn::device_loss_result<float, device_type>;
  using generator_type = typename network_holder<device_type, generator_on<device_type>>::type;
  using discriminator_type = typename network_holder<device_type, discriminator_on<device_type>>::type;

  // The networks are initialised on the host from the same seeds on every device, so a GPU run
  // starts from exactly the CPU run's weights.
  trainer(S& s, const train_options& o, int channels, int height, int width)
      : s_{s},
        o_{o},
        channels_{channels},
        height_{height},
        width_{width},
        g_ab_{s.mirror([&](auto& d) { return hold_generator(make_generator(o.gen, o.seed * 16 + 1, d), o.graphs); })},
        g_ba_{s.mirror([&](auto& d) { return hold_generator(make_generator(o.gen, o.seed * 16 + 2, d), o.graphs); })},
        d_a_{s.mirror(
            [&](auto& d) { return hold_discriminator(make_discriminator(o.disc, o.seed * 16 + 3, d), o.graphs); })},
        d_b_{s.mirror(
            [&](auto& d) { return hold_discriminator(make_discriminator(o.disc, o.seed * 16 + 4, d), o.graphs); })},
        og_ab_{s.mirror([&](auto&) { return make_adam(); })},
        og_ba_{s.mirror([&](auto&) { return make_adam(); })},
        od_a_{s.mirror([&](auto&) { return make_adam(); })},
        od_b_{s.mirror([&](auto&) { return make_adam(); })},
        pool_a_{o.pool_size, image_size(), o.seed * 16 + 5},
        pool_b_{o.pool_size, image_size(), o.seed * 16 + 6} {
    if (o.batch < 1) throw std::invalid_argument("--batch must be at least 1");
    if (o.graphs && std::is_same_v<device_type, dist::cpu>)
      throw std::invalid_argument("--graphs on needs --device cuda");
  }

  // Where CUDA graphs stand (--graphs on): per network, how many forward graphs it captured (one per
  // input shape met: the training batch, the pictures' rows), or why it runs eagerly. Empty where the
  // networks are not held for graphs.
  std::string graph_status() const {
    if constexpr (requires(const generator_type& g) { g.eager_reason(); }) {
      if (!o_.graphs) return {};
      std::string out;
      auto one = [&](const char* name, const auto& net) {
        out += std::string(out.empty() ? "" : "; ") + name + ": " +
               (!net.eager_reason().empty() ? "eager (" + net.eager_reason() + ")"
                : net.captures() == 0       ? std::string("not captured yet")
                                            : "graphs (" + std::to_string(net.captures()) + " forward capture" +
                                            (net.captures() == 1 ? ")" : "s)"));
      };
      one("G_AB", g_ab_.primary());
      one("G_BA", g_ba_.primary());
      one("D_A", d_a_.primary());
      one("D_B", d_b_.primary());
      return out;
    } else {
      return {};
    }
  }

  std::int64_t global_batch() const { return static_cast<std::int64_t>(o_.batch) * s_.num_replicas_in_sync(); }
  std::int64_t steps_done() const noexcept { return step_; }
  const train_options& options() const noexcept { return o_; }
  // Between steps: whether the next steps overlap their gradient all-reduce with backward (the same
  // results either way; benchmarks compare the time).
  void set_overlap(bool on) noexcept { o_.overlap = on; }

  // The learning rate of step `t` (0-based): warm-up to the (scaled) rate, constant, then linear
  // decay to zero over the last decay_fraction of the run (the reference's schedule, in steps).
  double learning_rate(std::int64_t t) const {
    const double k = o_.scale_lr ? s_.num_replicas_in_sync() : 1.0;
    double lr = o_.lr * k;
    if (t < o_.warmup_steps)
      lr = o_.lr * (1.0 + (k - 1.0) * static_cast<double>(t + 1) / static_cast<double>(o_.warmup_steps));
    const auto constant =
        static_cast<std::int64_t>(std::llround(static_cast<double>(o_.total_steps) * (1.0 - o_.decay_fraction)));
    const std::int64_t decay = o_.total_steps - constant;
    if (t >= constant && decay > 0) lr *= 1.0 - static_cast<double>(t - constant) / static_cast<double>(decay + 1);
    return lr;
  }

  // One training step on a GLOBAL batch of A and B images (NCHW).
  step_losses step(const tensor& a, const tensor& b) {
    if (a.shape() != b.shape() || a.shape()[0] != global_batch())
      throw std::invalid_argument("step: A and B must be global batches of " + std::to_string(global_batch()) +
                                  " images");
    const double lr = learning_rate(step_);
    for (auto* m : {&og_ab_, &og_ba_, &od_a_, &od_b_})
      for (auto& opt : *m) opt.set_lr(lr);
    step_losses out;
    const bool mirror =
        o_.place == placement::full ||
        (o_.place == placement::conditional && static_cast<std::size_t>(global_batch()) >= o_.mirror_threshold);
    const std::int64_t n = global_batch();
    // Each replica takes its share of the images as host tensors and puts them on its device.
    auto g_fn = [this, n](auto& r, const tensor& ra, const tensor& rb, generator_type& gab, generator_type& gba,
                          discriminator_type& da, discriminator_type& db, adam& oab, adam& oba) {
      if constexpr (W == wiring::tape)
        return taped_generator_step(r, on_replica(r, ra), on_replica(r, rb), gab, gba, da, db, oab, oba, n);
      else return generator_step(r, on_replica(r, ra), on_replica(r, rb), gab, gba, da, db, oab, oba, n);
    };
    auto d_fn = [this, n](auto& r, const tensor& ra, const tensor& rb, const tensor& fa, const tensor& fb,
                          discriminator_type& da, discriminator_type& db, adam& oa, adam& ob) {
      if constexpr (W == wiring::tape)
        return taped_discriminator_step(r, on_replica(r, ra), on_replica(r, rb), on_replica(r, fa), on_replica(r, fb),
                                        da, db, oa, ob, n);
      else
        return discriminator_step(r, on_replica(r, ra), on_replica(r, rb), on_replica(r, fa), on_replica(r, fb), da, db,
                                  oa, ob, n);
    };
    std::vector<float> fakes_a, fakes_b;
    if (mirror) {
      // Every block on every replica, over the replicas' shares.
      auto pa = scatter(a), pb = scatter(b);
      auto g = distribute::run_block(s_, distribute::make_block(distribute::every_replica, g_fn), pa, pb, g_ab_, g_ba_,
                                     d_a_, d_b_, og_ab_, og_ba_);
      // Every replica's losses and fakes, of every worker, in replica order.
      out += sum_over_replicas(g, [](const result& p) { return p.losses; });
      fakes_a = s_.gather(each_replica(g, [](const result& p) { return host_values(p.fake_a); }));
      fakes_b = s_.gather(each_replica(g, [](const result& p) { return host_values(p.fake_b); }));
    } else {
      // The generators once, on the primary, over the global batch; then every copy takes its update.
      auto g = distribute::run_block(s_, distribute::make_block(distribute::primary_only, g_fn), a, b, g_ab_, g_ba_,
                                     d_a_, d_b_, og_ab_, og_ba_);
      distribute::resync(s_, g_ab_, g_ba_, og_ab_, og_ba_);
      out += g.losses;
      fakes_a = host_values(g.fake_a);
      fakes_b = host_values(g.fake_b);
    }
    // The pools see the global batch of fakes on the primary, in order, whatever the placement.
    const tensor pooled_a{a.shape(), pool_a_.query(fakes_a)};
    const tensor pooled_b{b.shape(), pool_b_.query(fakes_b)};
    if (o_.place == placement::conditional && !mirror) {
      auto d = distribute::run_block(s_, distribute::make_block(distribute::primary_only, d_fn), a, b, pooled_a,
                                     pooled_b, d_a_, d_b_, od_a_, od_b_);
      distribute::resync(s_, d_a_, d_b_, od_a_, od_b_);
      out += d;
    } else {
      auto pa = scatter(a), pb = scatter(b), pfa = scatter(pooled_a), pfb = scatter(pooled_b);
      auto d = distribute::run_block(s_, distribute::make_block(distribute::every_replica, d_fn), pa, pb, pfa, pfb,
                                     d_a_, d_b_, od_a_, od_b_);
      out += sum_over_replicas(d, [](const step_losses& p) { return p; });
    }
    if (o_.disc.norm == norm_kind::batch) share_running_statistics();
    ++step_;
    return out;
  }

  // A -> B -> A and B -> A -> B of a few images, on the primary: for the picture grids (host tensors).
  struct translations {
    tensor fake_b, rec_a, fake_a, rec_b;
  };
  translations translate_samples(const tensor& a, const tensor& b) {
    return s_.run_on_primary(
        [](auto& r, generator_type& gab, generator_type& gba, const tensor& ha, const tensor& hb) {
          const auto& x = on_replica(r, ha);
          const auto& y = on_replica(r, hb);
          const device_tensor fake_b = gab.forward(r, x), rec_a = gba.forward(r, fake_b);
          const device_tensor fake_a = gba.forward(r, y), rec_b = gab.forward(r, fake_a);
          return translations{on_host(fake_b), on_host(rec_a), on_host(fake_a), on_host(rec_b)};
        },
        g_ab_, g_ba_, a, b);
  }

  // Everything a resumed run needs to continue exactly: the four networks, the four optimiser
  // states, the step (with the batch size it fixes the data position), the pools and their engines.
  void save(ckpt::archive& ar) const {
    auto& self = const_cast<trainer&>(*this);  // parameter enumeration is non-const
    ar.put_model("g_ab", self.g_ab_.primary());
    ar.put_model("g_ba", self.g_ba_.primary());
    ar.put_model("d_a", self.d_a_.primary());
    ar.put_model("d_b", self.d_b_.primary());
    ar.put_state("adam_g_ab", og_ab_.primary());
    ar.put_state("adam_g_ba", og_ba_.primary());
    ar.put_state("adam_d_a", od_a_.primary());
    ar.put_state("adam_d_b", od_b_.primary());
    ar.put("step", step_);
    ar.put("global_batch", global_batch());
    ar.put("seed", o_.seed);
    ar.put_vector("pool_a", pool_a_.stored());
    ar.put_vector("pool_b", pool_b_.stored());
    ar.put_text("pool_a_engine", pool_a_.engine());
    ar.put_text("pool_b_engine", pool_b_.engine());
  }

  void load(const ckpt::archive& ar) {
    if (const auto gb = ar.get<std::int64_t>("global_batch"); gb != global_batch())
      throw std::invalid_argument("the checkpoint was trained with a global batch of " + std::to_string(gb) +
                                  ", this run has " + std::to_string(global_batch()) +
                                  " (--batch x --replicas): the data position would not match");
    if (const auto seed = ar.get<std::uint64_t>("seed"); seed != o_.seed)
      throw std::invalid_argument("the checkpoint was trained with --seed " + std::to_string(seed) + ", this run has " +
                                  std::to_string(o_.seed));
    load_networks(ar);
    for (auto& opt : og_ab_) ar.get_state("adam_g_ab", opt);
    for (auto& opt : og_ba_) ar.get_state("adam_g_ba", opt);
    for (auto& opt : od_a_) ar.get_state("adam_d_a", opt);
    for (auto& opt : od_b_) ar.get_state("adam_d_b", opt);
    step_ = ar.get<std::int64_t>("step");
    pool_a_.set_stored(ar.get_vector<float>("pool_a"));
    pool_b_.set_stored(ar.get_vector<float>("pool_b"));
    ar.get_text("pool_a_engine", pool_a_.engine());
    ar.get_text("pool_b_engine", pool_b_.engine());
  }
  // The networks only (evaluation).
  void load_networks(const ckpt::archive& ar) {
    for (auto& m : g_ab_) ar.get_model("g_ab", m);
    for (auto& m : g_ba_) ar.get_model("g_ba", m);
    for (auto& m : d_a_) ar.get_model("d_a", m);
    for (auto& m : d_b_) ar.get_model("d_b", m);
  }

  static generator_type hold_generator(generator_on<device_type> g, bool graphs) {
    return network_holder<device_type, generator_on<device_type>>::hold(std::move(g), graphs);
  }
  static discriminator_type hold_discriminator(discriminator_on<device_type> d, bool graphs) {
    return network_holder<device_type, discriminator_on<device_type>>::hold(std::move(d), graphs);
  }

  // Checks that the mirrored copies are still identical (throws mirrored_divergence otherwise).
  void verify_mirrored() const {
    s_.verify_mirrored(g_ab_);
    s_.verify_mirrored(g_ba_);
    s_.verify_mirrored(d_a_);
    s_.verify_mirrored(d_b_);
    s_.verify_mirrored(og_ab_);
    s_.verify_mirrored(og_ba_);
    s_.verify_mirrored(od_a_);
    s_.verify_mirrored(od_b_);
  }

  using generators = typename S::template mirrored_type<generator_type>;
  using discriminators = typename S::template mirrored_type<discriminator_type>;
  generators& g_ab() noexcept { return g_ab_; }
  generators& g_ba() noexcept { return g_ba_; }
  discriminators& d_a() noexcept { return d_a_; }
  discriminators& d_b() noexcept { return d_b_; }

 private:
  // How each network's gradients are all-reduced: DDP's buckets, travelling as o_.compression says.
  dist::gradient_reduction reduction() const noexcept { return {.compression = o_.compression}; }

  using result = generator_result<device_type>;

  adam make_adam() const { return adam{{.lr = o_.lr, .beta1 = o_.beta1, .beta2 = o_.beta2}}; }
  std::size_t image_size() const { return static_cast<std::size_t>(channels_) * height_ * width_; }

  // f(this worker's part of replica r) for each of its replicas, as the strategy's per-replica value.
  template <class Parts, class F>
  auto each_replica(const Parts& parts, F&& f) const {
    const int first = s_.first_replica_id();
    return s_.values_from_function([&](int id) { return f(parts[static_cast<std::size_t>(id - first)]); });
  }
  // The losses of every replica of every worker, summed in replica order.
  template <class Parts, class F>
  step_losses sum_over_replicas(const Parts& parts, F&& losses_of) const {
    return step_losses::from(s_.reduce(distribute::reduce_op::sum,
                                       each_replica(parts, [&](const auto& p) { return losses_of(p).values(); })));
  }

  // Plain batch norm's running statistics come from each replica's own share, so the copies of the
  // discriminators drift apart in them (not in their parameters). As PyTorch's DDP does with its
  // buffers, every replica takes the primary's after each step: the copies stay identical, as
  // verify_mirrored checks, and no result changes (training mode normalises with the batch's
  // statistics; the checkpoint holds the primary's).
  void share_running_statistics() {
    s_.run(
        [](auto& r, discriminator_type& da, discriminator_type& db) {
          std::vector<double> all;
          for (auto* d : {&da, &db})
            d->for_each_buffer([&](std::span<double> b) { all.insert(all.end(), b.begin(), b.end()); });
          r.broadcast(std::span<double>(all), 0);
          std::size_t at = 0;
          for (auto* d : {&da, &db})
            d->for_each_buffer([&](std::span<double> b) {
              std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(at), b.size(), b.begin());
              at += b.size();
            });
        },
        d_a_, d_b_);
  }

  // The replicas' shares of a global batch, as NCHW tensors.
  auto scatter(const tensor& x) {
    auto parts = s_.scatter(std::span<const float>(x.data(), x.size()), image_size());
    const int first = s_.first_replica_id();  // this worker's parts are replicas first, first + 1, ...
    return s_.values_from_function([&](int r) {
      auto& v = parts[static_cast<std::size_t>(r - first)];
      const auto count = static_cast<std::int64_t>(v.size() / image_size());
      return tensor{dist::shape::nchw(count, channels_, height_, width_), std::move(v)};
    });
  }

  // The generators' half of the step on `a` and `b` (this replica's share; n = global batch):
  // identity, then A -> B -> A and B -> A -> B, each path's backward right after its forward (a
  // layer keeps the state of its last forward only), then the summed gradients and the update.
  //
  // The losses' values stay on the replica's device until the half-step is queued and are read at
  // its end (on a GPU: one wait for the stream per half-step, not one per loss); the same bits.
  template <class R>
  result generator_step(R& r, const device_tensor& a, const device_tensor& b, generator_type& gab, generator_type& gba,
                        discriminator_type& da, discriminator_type& db, adam& oab, adam& oba, std::int64_t n) {
    result out;
    gab.zero_grad();
    gba.zero_grad();
    const double w_cyc = o_.lambda_cycle, w_idt = o_.lambda_cycle * o_.lambda_identity;
    std::optional<device_loss> idt_a, idt_b;
    if (w_idt > 0) {
      idt_b = nn::l1(r, gab.forward(r, b), b, n, nn::value_on_device);
      gab.backward(r, scaled(r, idt_b->grad, w_idt), nn::no_input_gradient);  // b is data
      idt_a = nn::l1(r, gba.forward(r, a), a, n, nn::value_on_device);
      gba.backward(r, scaled(r, idt_a->grad, w_idt), nn::no_input_gradient);
    }
    std::vector<device_loss> cycle, adversarial;  // per path, in order
    // With overlap, the second path holds both generators' last backward: each network joins the
    // overlap just before it, and its buckets go while the rest of the step computes.
    auto sync = r.overlap_gradients(reduction());
    auto path = [&](const device_tensor& real, generator_type& g, generator_type& back, discriminator_type& d,
                    bool last) {
      device_tensor fake = g.forward(r, real);
      const auto& cyc = cycle.emplace_back(nn::l1(r, back.forward(r, fake), real, n, nn::value_on_device));
      if (last && o_.overlap) sync.add(back);
      device_tensor dfake = back.backward(r, scaled(r, cyc.grad, w_cyc));
      const device_tensor score = d.forward(r, fake);
      const auto& adv = adversarial.emplace_back(nn::mse(r, score, filled_like(score, 1.0f), n, nn::value_on_device));
      add_to(r, dfake, d.backward(r, adv.grad));
      if (last && o_.overlap) sync.add(g);
      g.backward(r, dfake, nn::no_input_gradient);  // real is data
      return fake;
    };
    cycle.reserve(2);
    adversarial.reserve(2);
    out.fake_b = path(a, gab, gba, db, false);
    out.fake_a = path(b, gba, gab, da, true);
    reduce_and_step(r, sync, gab, gba, oab, oba);
    if (idt_a) out.losses.identity = w_idt * (idt_a->host_value() + idt_b->host_value());
    for (const auto& cyc : cycle) out.losses.cycle += w_cyc * cyc.host_value();
    out.losses.gan_ab = adversarial[0].host_value();
    out.losses.gan_ba = adversarial[1].host_value();
    return out;
  }

  // The discriminators' half: LSGAN, 0.5 (mse(D(real), 1) + mse(D(fake), 0)).
  template <class R>
  step_losses discriminator_step(R& r, const device_tensor& real_a, const device_tensor& real_b,
                                 const device_tensor& fake_a, const device_tensor& fake_b, discriminator_type& da,
                                 discriminator_type& db, adam& oa, adam& ob, std::int64_t n) {
    step_losses out;
    // With overlap, D_A's buckets go while D_B computes and D_B's while its own backward finishes;
    // both updates wait for the end (neither network reads the other).
    auto sync = r.overlap_gradients(reduction());
    std::vector<device_loss> on_real, on_fake;  // D_A's, then D_B's
    on_real.reserve(2);
    on_fake.reserve(2);
    auto one = [&](discriminator_type& d, const device_tensor& real, const device_tensor& fake) {
      d.zero_grad();
      const device_tensor sr = d.forward(r, real);
      const auto& lr = on_real.emplace_back(nn::mse(r, sr, filled_like(sr, 1.0f), n, nn::value_on_device));
      d.backward(r, scaled(r, lr.grad, 0.5), nn::no_input_gradient);  // images are data here
      const device_tensor sf = d.forward(r, fake);
      const auto& lf = on_fake.emplace_back(nn::mse(r, sf, filled_like(sf, 0.0f), n, nn::value_on_device));
      if (o_.overlap) sync.add(d);
      d.backward(r, scaled(r, lf.grad, 0.5), nn::no_input_gradient);
      if (!o_.overlap) r.all_reduce_gradients(d, reduction());
    };
    one(da, real_a, fake_a);
    if (!o_.overlap) oa.step(r, da);
    one(db, real_b, fake_b);
    sync.wait();
    if (o_.overlap) oa.step(r, da);
    ob.step(r, db);
    out.d_a = 0.5 * (on_real[0].host_value() + on_fake[0].host_value());
    out.d_b = 0.5 * (on_real[1].host_value() + on_fake[1].host_value());
    return out;
  }

  // The end of a half-step over two networks: the overlap's wait (or, without overlap, their
  // all-reduce), then both optimiser steps.
  template <class R, class Sync, class N>
  void reduce_and_step(R& r, Sync& sync, N& first, N& second, adam& first_opt, adam& second_opt) {
    sync.wait();
    if (!o_.overlap) {
      r.all_reduce_gradients(first, reduction());
      r.all_reduce_gradients(second, reduction());
    }
    first_opt.step(r, first);
    second_opt.step(r, second);
  }
  // A tape's backward with both networks in the overlap (their buckets go during it), then the end
  // of the half-step.
  template <class R, class Tape, class N>
  void backward_and_step(R& r, Tape& t, N& first, N& second, adam& first_opt, adam& second_opt) {
    auto sync = r.overlap_gradients(reduction());
    if (o_.overlap) {
      sync.add(first);
      sync.add(second);
    }
    t.backward();
    reduce_and_step(r, sync, first, second, first_opt, second_opt);
  }

  // The generators' half on an nn::tape: the forward written as the graph it is (each generator
  // applied three times, the discriminators frozen: their parameters' gradients untouched) and one
  // backward. A tape runs the backwards in the reverse of the calls, so the calls are recorded in the
  // reverse of generator_step's backward order (B -> A -> B, then A -> B -> A, then identity): each
  // generator's parameter gradients are then summed in the same order, and the fakes' two gradients
  // (cycle and adversarial) are one addition either way, so the gradients and the update are
  // generator_step's, bit for bit.
  template <class R>
  result taped_generator_step(R& r, const device_tensor& a, const device_tensor& b, generator_type& gab,
                              generator_type& gba, discriminator_type& da, discriminator_type& db, adam& oab, adam& oba,
                              std::int64_t n) {
    result out;
    gab.zero_grad();
    gba.zero_grad();
    const double w_cyc = o_.lambda_cycle, w_idt = o_.lambda_cycle * o_.lambda_identity;
    const auto l1_to = [&r, n](const device_tensor& target) {
      return [&r, &target, n](const device_tensor& y) { return nn::l1(r, y, target, n, nn::value_on_device); };
    };
    const auto real_score = [&r, n](const device_tensor& s) {
      return nn::mse(r, s, filled_like(s, 1.0f), n, nn::value_on_device);
    };
    nn::tape<R> t{r};
    const auto real_a = t.constant(a), real_b = t.constant(b);  // data: no input gradient
    const auto fake_a = t(gba, real_b);
    const device_loss cycle_b = t.loss(t(gab, fake_a), l1_to(b), static_cast<float>(w_cyc));
    const device_loss gan_ba = t.loss(t(da, fake_a, nn::frozen), real_score);
    const auto fake_b = t(gab, real_a);
    const device_loss cycle_a = t.loss(t(gba, fake_b), l1_to(a), static_cast<float>(w_cyc));
    const device_loss gan_ab = t.loss(t(db, fake_b, nn::frozen), real_score);
    std::optional<device_loss> idt_a, idt_b;
    if (w_idt > 0) {
      idt_a = t.loss(t(gba, real_a), l1_to(a), static_cast<float>(w_idt));
      idt_b = t.loss(t(gab, real_b), l1_to(b), static_cast<float>(w_idt));
    }
    // Each generator's buckets go during its last backward (the tape holds the earlier ones).
    backward_and_step(r, t, gab, gba, oab, oba);
    out.fake_a = fake_a.value();
    out.fake_b = fake_b.value();
    if (idt_a) out.losses.identity = w_idt * (idt_a->host_value() + idt_b->host_value());
    out.losses.cycle = w_cyc * cycle_a.host_value();
    out.losses.cycle += w_cyc * cycle_b.host_value();
    out.losses.gan_ab = gan_ab.host_value();
    out.losses.gan_ba = gan_ba.host_value();
    return out;
  }

  // The discriminators' half on a tape. Recorded D_B first and each on the fake first, its backward
  // runs discriminator_step's order (D_A on real, on fake, then D_B): the same gradients, bit for
  // bit. The forwards run in the other order, which only plain batch norm's running statistics
  // (their momentum updates) would see.
  template <class R>
  step_losses taped_discriminator_step(R& r, const device_tensor& real_a, const device_tensor& real_b,
                                       const device_tensor& fake_a, const device_tensor& fake_b, discriminator_type& da,
                                       discriminator_type& db, adam& oa, adam& ob, std::int64_t n) {
    step_losses out;
    da.zero_grad();
    db.zero_grad();
    const auto score_of = [&r, n](float target) {
      return [&r, n, target](const device_tensor& s) {
        return nn::mse(r, s, filled_like(s, target), n, nn::value_on_device);
      };
    };
    nn::tape<R> t{r};
    const device_loss fake_b_loss = t.loss(t(db, t.constant(fake_b)), score_of(0.0f), 0.5f);
    const device_loss real_b_loss = t.loss(t(db, t.constant(real_b)), score_of(1.0f), 0.5f);
    const device_loss fake_a_loss = t.loss(t(da, t.constant(fake_a)), score_of(0.0f), 0.5f);
    const device_loss real_a_loss = t.loss(t(da, t.constant(real_a)), score_of(1.0f), 0.5f);
    backward_and_step(r, t, da, db, oa, ob);
    out.d_a = 0.5 * (real_a_loss.host_value() + fake_a_loss.host_value());
    out.d_b = 0.5 * (real_b_loss.host_value() + fake_b_loss.host_value());
    return out;
  }

  S& s_;
  train_options o_;
  int channels_, height_, width_;
  generators g_ab_, g_ba_;
  discriminators d_a_, d_b_;
  typename S::template mirrored_type<adam> og_ab_, og_ba_, od_a_, od_b_;
  image_pool pool_a_, pool_b_;
  std::int64_t step_ = 0;
};

// Translation quality, scored by the frozen classifier on TEST images: the share of A->B
// translations it places in B's class (and B->A in A's), the untranslated baseline, and the cycle L1.
struct scores {
  double a_to_b = 0, b_to_a = 0;          // target-class rates
  double baseline_a = 0, baseline_b = 0;  // rate of the untranslated images in the other class
  double cycle_l1_a = 0, cycle_l1_b = 0;  // mean |G_ba(G_ab(a)) - a| per pixel, in [-1, 1] units
  std::int64_t count_a = 0, count_b = 0;
  std::array<double, classes> classes_ab{}, classes_ba{};  // where the translations went, per class
};

template <distribute::strategy S, class Generators, class Classifiers>
scores evaluate(S& s, Generators& g_ab, Generators& g_ba, Classifiers& clf, const tensor& test_a, const tensor& test_b,
                std::int32_t class_a, std::int32_t class_b) {
  scores out;
  const std::int64_t image = test_a.size() / static_cast<std::size_t>(std::max<std::int64_t>(1, test_a.shape()[0]));
  auto direction = [&](const tensor& x, auto& forward, auto& backward, std::int32_t target, double& rate, double& base,
                       double& l1, std::array<double, classes>& where) {
    const std::int64_t total = x.shape()[0], chunk = 100;
    std::int64_t hits = 0, base_hits = 0;
    double l1_sum = 0;
    for (std::int64_t first = 0; first < total; first += chunk) {
      const std::int64_t count = std::min(chunk, total - first);
      std::vector<float> part(x.data() + first * image, x.data() + (first + count) * image);
      auto shares = s.scatter(part, static_cast<std::size_t>(image));
      // Each replica's tally: {hits, untranslated hits, L1 sum, count per class ...}, summed over
      // every replica of every worker by the strategy.
      auto results = s.run(
          [&](auto& r, std::vector<float>& v, auto& g, auto& back, auto& c) {
            std::vector<double> t(3 + classes, 0.0);
            const auto k = static_cast<std::int64_t>(v.size()) / image;
            if (k == 0) return t;
            const tensor host_in{dist::shape::nchw(k, x.shape()[1], x.shape()[2], x.shape()[3]), v};
            const auto& in = on_replica(r, host_in);
            const auto fake = g.forward(r, in);
            const tensor rec = on_host(back.forward(r, fake));
            for (auto p : predict(r, c, fake)) {
              t[0] += p == target;
              ++t[3 + static_cast<std::size_t>(p)];
            }
            for (auto p : predict(r, c, in)) t[1] += p == target;
            for (std::size_t i = 0; i < host_in.size(); ++i) t[2] += std::abs(static_cast<double>(rec[i]) - host_in[i]);
            return t;
          },
          shares, forward, backward, clf);
      const std::vector<double> t = s.reduce(dist::reduce_op::sum, results);
      hits += static_cast<std::int64_t>(t[0]), base_hits += static_cast<std::int64_t>(t[1]), l1_sum += t[2];
      for (std::size_t k = 0; k < classes; ++k) where[k] += t[3 + k] / static_cast<double>(total);
    }
    rate = total ? static_cast<double>(hits) / static_cast<double>(total) : 0;
    base = total ? static_cast<double>(base_hits) / static_cast<double>(total) : 0;
    l1 = total ? l1_sum / static_cast<double>(total * image) : 0;
  };
  direction(test_a, g_ab, g_ba, class_b, out.a_to_b, out.baseline_a, out.cycle_l1_a, out.classes_ab);
  direction(test_b, g_ba, g_ab, class_a, out.b_to_a, out.baseline_b, out.cycle_l1_b, out.classes_ba);
  out.count_a = test_a.shape()[0];
  out.count_b = test_b.shape()[0];
  return out;
}

}  // namespace cyclegan
