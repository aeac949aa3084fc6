// Optimisers against hand-computed references, their saved form, copies, and their state following
// the model to its device (through a test device whose memory is host memory); fused gradient
// all-reduce; data-parallel equivalence of a conv net with sync_batch_norm over 1 to 4 replicas;
// bit-identical reruns.

#include "nn_test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;
using dist::shape;
using dist::tensor;

namespace {

// The smallest parameterized model: a few flat parameter tensors with hand-set gradients.
template <class T>
struct flat_model {
  using scalar_type = T;
  std::vector<std::vector<T>> values, grads;

  explicit flat_model(std::vector<std::size_t> sizes) {
    for (auto n : sizes) {
      values.emplace_back(n, T(0));
      grads.emplace_back(n, T(0));
    }
  }
  template <class F>
  void for_each_parameter(F&& f) {
    for (std::size_t i = 0; i < values.size(); ++i) f(std::span<T>(values[i]), std::span<T>(grads[i]));
  }
};
static_assert(nn::parameterized<flat_model<float>>);
static_assert(!nn::parameterized<std::vector<float>>);

// A test device whose memory is host memory, to take the optimisers' device path (their state held
// as tensor<T, D> of the engine's device, optim/detail/state_buffers.hpp) on a machine without a GPU.
// It says its memory is not the host's (device_traits); `stream` stands for the stream a GPU device is
// bound to.
struct host_memory_device {
  static constexpr bool host_memory = false;
  int ordinal = 0;
  int stream = 0;
  int index() const noexcept { return ordinal; }
  std::string name() const { return "test:" + std::to_string(ordinal) + "/" + std::to_string(stream); }
  friend bool operator==(const host_memory_device&, const host_memory_device&) = default;
};
static_assert(dist::device<host_memory_device>);

// Every live buffer of a tensor<T, host_memory_device>, with the device that holds it.
std::map<const void*, host_memory_device>& device_buffers() {
  static std::map<const void*, host_memory_device> live;
  return live;
}
// What the host asked of the test device's memory: reads (each a wait for a GPU) and copies up
// (from pageable memory, also a wait), and element fills (queued, no wait).
struct device_traffic {
  int reads = 0, copies_up = 0, fills = 0;
};
device_traffic& traffic() {
  static device_traffic t;
  return t;
}

}  // namespace

// The tensor of the test device: what the optimisers' device state asks of a device's tensor, and
// no copies (the state must go through the host to be copied).
template <class T>
class distribute::tensor<T, host_memory_device> {
 public:
  tensor(dist::shape s, host_memory_device d)
      : device_{d}, size_{static_cast<std::size_t>(s.numel())}, data_{new T[size_]()} {
    device_buffers().emplace(data_.get(), device_);
  }
  static tensor from_host(dist::shape s, std::span<const T> values, host_memory_device d) {
    tensor t{s, d};
    BOOST_TEST_REQUIRE(values.size() == t.size_);
    std::copy(values.begin(), values.end(), t.data_.get());
    return t;
  }
  tensor(const tensor&) = delete;
  tensor& operator=(const tensor&) = delete;
  tensor(tensor&&) noexcept = default;
  tensor& operator=(tensor&&) = delete;
  ~tensor() {
    if (data_) device_buffers().erase(data_.get());
  }
  std::size_t size() const noexcept { return size_; }
  T* data() noexcept { return data_.get(); }
  std::vector<T> to_vector() const {
    ++traffic().reads;
    return std::vector<T>(data_.get(), data_.get() + size_);
  }
  void copy_from_host(std::span<const T> values) {
    ++traffic().copies_up;
    BOOST_TEST_REQUIRE(values.size() == size_);
    std::copy(values.begin(), values.end(), data_.get());
  }
  void fill(T v, std::size_t offset, std::size_t count) {
    ++traffic().fills;
    BOOST_TEST_REQUIRE(offset + count <= size_);
    std::fill_n(data_.get() + offset, count, v);
  }

 private:
  host_memory_device device_;
  std::size_t size_ = 0;
  std::unique_ptr<T[]> data_;
};

namespace {

// The engine of a replica on the test device: serial, and every optimiser update it runs must find
// its state (Adam's m and v, SGD's velocity) in buffers of its own device.
struct host_memory_engine {
  using device_type = host_memory_device;
  explicit host_memory_engine(host_memory_device dev) : d{dev} {}
  host_memory_device d;
  int state_checks = 0;
  bool capturing_now = false;  // stands for a GPU stream being captured into a CUDA graph
  const host_memory_device& device() const noexcept { return d; }
  bool capturing() const noexcept { return capturing_now; }
  template <class F>
  void for_each(std::int64_t n, F f) {
    if constexpr (requires { f.m; }) check(f.m);
    if constexpr (requires { f.v; }) check(f.v);
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }
  void check(const void* state) {
    ++state_checks;
    const auto it = device_buffers().find(state);
    BOOST_TEST_REQUIRE((it != device_buffers().end()), "optimiser state outside the memory of " << d.name());
    BOOST_TEST_REQUIRE((it->second == d), "optimiser state on " << it->second.name() << ", stepped on " << d.name());
  }
};
struct host_memory_replica {
  explicit host_memory_replica(host_memory_device d) : e{d} {}
  host_memory_engine e;
  host_memory_engine& engine() { return e; }
};

// Fresh gradients for step t, the same for every copy of a model.
template <class T>
void set_gradients(flat_model<T>& model, int t) {
  for (std::size_t p = 0; p < model.grads.size(); ++p)
    for (std::size_t i = 0; i < model.grads[p].size(); ++i)
      model.grads[p][i] = static_cast<T>(std::sin(static_cast<double>(t * 13 + static_cast<int>(p * 5 + i))));
}
template <class O>
std::string saved(const O& opt) {
  std::ostringstream os;
  opt.save(os);
  return std::move(os).str();
}
template <class O>
void load(O& opt, const std::string& bytes) {
  std::istringstream is(bytes);
  opt.load(is);
}
bool same_bits(const flat_model<float>& a, const flat_model<float>& b) {
  if (a.values.size() != b.values.size()) return false;
  for (std::size_t p = 0; p < a.values.size(); ++p)
    if (a.values[p].size() != b.values[p].size() ||
        std::memcmp(a.values[p].data(), b.values[p].data(), a.values[p].size() * sizeof(float)) != 0)
      return false;
  return true;
}
const char* const mismatch_message =
    "distribute: optimiser state does not match the model (parameter 0 has 4 elements)";

}  // namespace

BOOST_AUTO_TEST_SUITE(optimisers)

BOOST_AUTO_TEST_CASE(adam_matches_a_hand_computed_reference) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01; gradients chosen per step.
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  flat_model<double> model({2});
  model.values[0] = {1.0, -2.0};
  optim::adam<double> opt{{.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd}};
  const double grads[3][2] = {{0.5, -1.0}, {0.25, 2.0}, {-0.1, 0.0}};
  // The textbook algorithm, step by step, in plain scalars.
  double p[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
  for (int t = 1; t <= 3; ++t) {
    model.grads[0] = {grads[t - 1][0], grads[t - 1][1]};
    opt.step(model);
    for (int i = 0; i < 2; ++i) {
      const double g = grads[t - 1][i] + wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
      BOOST_TEST(model.values[0][static_cast<std::size_t>(i)] == p[i], boost::test_tools::tolerance(1e-12));
    }
    if (t == 1) {
      // By hand: after one step m_hat = g and v_hat = g^2, so the update is lr * sign(g) (to eps).
      BOOST_TEST(model.values[0][0] == 1.0 - 0.1, boost::test_tools::tolerance(1e-7));
      BOOST_TEST(model.values[0][1] == -2.0 + 0.1, boost::test_tools::tolerance(1e-7));
    }
  }
  // Element 0 by hand: g1 = 0.5 + 0.01*1 = 0.51, m1 = 0.051, v1 = 0.0002601, p1 = 0.9;
  // g2 = 0.25 + 0.01*0.9 = 0.259, m2 = 0.9*0.051 + 0.1*0.259 = 0.0718,
  // v2 = 0.999*0.0002601 + 0.001*0.067081 = 0.00032692, p2 = 0.9 - 0.1*(0.0718/0.19)/sqrt(v2/0.001999)
  // = 0.806555; g3 = -0.1 + 0.01*p2, m3 = 0.0554266, v3 = 0.000335046, p3 = 0.745385.
  BOOST_TEST(model.values[0][0] == 0.745385, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(opt.steps() == 3);
}

BOOST_AUTO_TEST_CASE(sgd_with_momentum_matches_a_hand_computed_reference) {
  flat_model<double> model({1});
  model.values[0] = {1.0};
  optim::sgd<double> opt{{.lr = 0.1, .momentum = 0.9}};
  // v1 = 1, p = 0.9; v2 = 0.9 + 2 = 2.9, p = 0.61; v3 = 2.61 - 1 = 1.61, p = 0.449.
  const double g[3] = {1.0, 2.0, -1.0}, expected[3] = {0.9, 0.61, 0.449};
  for (int t = 0; t < 3; ++t) {
    model.grads[0] = {g[t]};
    opt.step(model);
    BOOST_TEST(model.values[0][0] == expected[t], boost::test_tools::tolerance(1e-14));
  }
}

BOOST_AUTO_TEST_CASE(state_round_trips_bit_for_bit) {
  auto run = [](auto& opt, flat_model<float>& model, int from, int to) {
    for (int t = from; t < to; ++t) {
      for (std::size_t i = 0; i < model.grads[0].size(); ++i)
        model.grads[0][i] = std::sin(static_cast<float>(t * 7 + static_cast<int>(i)));
      opt.step(model);
    }
  };
  for (int kind = 0; kind < 2; ++kind) {
    flat_model<float> a({5}), b({5});
    optim::adam<float> adam_a{{.lr = 0.01}}, adam_b{{.lr = 0.01}};
    optim::sgd<float> sgd_a{{.lr = 0.01, .momentum = 0.5}}, sgd_b{{.lr = 0.01, .momentum = 0.5}};
    std::stringstream saved;
    if (kind == 0) {
      run(adam_a, a, 0, 2);
      adam_a.save(saved);
      b = a;
      adam_b.load(saved);
      BOOST_TEST(adam_b.state_digest() == adam_a.state_digest());
      run(adam_a, a, 2, 4);
      run(adam_b, b, 2, 4);
    } else {
      run(sgd_a, a, 0, 2);
      sgd_a.save(saved);
      b = a;
      sgd_b.load(saved);
      run(sgd_a, a, 2, 4);
      run(sgd_b, b, 2, 4);
    }
    BOOST_TEST(std::memcmp(a.values[0].data(), b.values[0].data(), 5 * sizeof(float)) == 0);
  }
  std::stringstream garbage("not a state");
  optim::adam<float> opt;
  BOOST_CHECK_THROW(opt.load(garbage), std::runtime_error);
  std::stringstream sgd_state;
  optim::sgd<float>{}.save(sgd_state);
  BOOST_CHECK_THROW(opt.load(sgd_state), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(state_must_match_the_model) {
  flat_model<float> small({3}), large({4});
  optim::adam<float> opt;
  opt.step(small);
  BOOST_CHECK_THROW(opt.step(large), std::invalid_argument);
  optim::sgd<float> with_momentum{{.momentum = 0.9}};
  with_momentum.step(small);
  BOOST_CHECK_EXCEPTION(with_momentum.step(large), std::invalid_argument,
                        [](const std::invalid_argument& e) { return std::string(e.what()) == mismatch_message; });
  BOOST_CHECK_EXCEPTION(opt.step(large), std::invalid_argument,
                        [](const std::invalid_argument& e) { return std::string(e.what()) == mismatch_message; });
}

// The saved form is the one older checkpoints hold: the tag, the step count, then each buffer set as
// (count, then each buffer's size and values). A state in that form loads and saves back byte for byte.
BOOST_AUTO_TEST_CASE(the_saved_form_is_unchanged) {
  std::string adam_bytes("adam-v1\0", 8), sgd_bytes("sgd-v1\0\0", 8);
  auto put = [](std::string& out, const auto& v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(adam_bytes, std::int64_t{3});
  put(sgd_bytes, std::int64_t{5});
  for (int set = 0; set < 2; ++set) {
    put(adam_bytes, std::uint64_t{2});
    put(adam_bytes, std::uint64_t{2});
    put(adam_bytes, 0.25f + static_cast<float>(set));
    put(adam_bytes, -1.5f);
    put(adam_bytes, std::uint64_t{1});
    put(adam_bytes, 3.0f);
  }
  put(sgd_bytes, std::uint64_t{1});
  put(sgd_bytes, std::uint64_t{3});
  for (const float x : {1.0f, 2.0f, -4.0f}) put(sgd_bytes, x);
  optim::adam<float> adam;
  optim::sgd<float> sgd;
  load(adam, adam_bytes);
  load(sgd, sgd_bytes);
  BOOST_TEST(adam.steps() == 3);
  BOOST_TEST(sgd.steps() == 5);
  BOOST_TEST(saved(adam) == adam_bytes);
  BOOST_TEST(saved(sgd) == sgd_bytes);
  // And a stepped state is in that form too: 8 + 8 + 2 * (8 + (8 + 4 * 4) + (8 + 4 * 1)) bytes.
  flat_model<float> m({4, 1});
  set_gradients(m, 0);
  optim::adam<float> stepped;
  stepped.step(m);
  BOOST_TEST(saved(stepped).size() == 16u + 2u * (8u + 24u + 12u));
}

// A saved state whose step count is negative is corrupt (it would drive Adam's bias corrections),
// for either optimiser and either form; the optimiser is left as it was.
BOOST_AUTO_TEST_CASE(a_negative_step_count_is_corrupt) {
  auto put = [](std::string& out, const auto& v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  std::string adam_bytes("adam-v1\0", 8), sgd_bytes("sgd-v1\0\0", 8);
  put(adam_bytes, std::int64_t{-2});
  put(adam_bytes, std::uint64_t{0});
  put(adam_bytes, std::uint64_t{0});
  put(sgd_bytes, std::int64_t{-1});
  put(sgd_bytes, std::uint64_t{0});
  auto corrupt = [](const std::runtime_error& e) { return dist::test::mentions(e.what(), "negative step count"); };
  for (const bool capturable : {false, true}) {
    optim::adam<float> adam{{.capturable = capturable}};
    optim::sgd<float> sgd{{.capturable = capturable}};
    BOOST_CHECK_EXCEPTION(load(adam, adam_bytes), std::runtime_error, corrupt);
    BOOST_CHECK_EXCEPTION(load(sgd, sgd_bytes), std::runtime_error, corrupt);
    BOOST_TEST(adam.steps() == 0);
    BOOST_TEST(sgd.steps() == 0);
  }
}

// A copy (constructed or assigned) is deep: stepping it leaves the source as it was, and stepping a
// copy steps exactly as the source would.
BOOST_AUTO_TEST_CASE(copies_are_deep_and_step_as_the_source) {
  flat_model<float> model({5, 3});
  optim::adam<float> source{{.lr = 0.01, .weight_decay = 1e-3}};
  optim::sgd<float> sgd_source{{.lr = 0.01, .momentum = 0.9}};
  for (int t = 0; t < 3; ++t) {
    set_gradients(model, t);
    source.step(model);
    sgd_source.step(model);
  }
  const auto adam_before = saved(source), sgd_before = saved(sgd_source);

  optim::adam<float> constructed{source};
  optim::adam<float> assigned;
  assigned = source;
  optim::sgd<float> sgd_constructed{sgd_source}, sgd_assigned;
  sgd_assigned = sgd_source;
  BOOST_TEST(constructed.state_digest() == source.state_digest());
  BOOST_TEST(assigned.state_digest() == source.state_digest());
  BOOST_TEST(sgd_assigned.state_digest() == sgd_source.state_digest());
  BOOST_TEST(saved(assigned) == adam_before);
  BOOST_TEST(saved(sgd_assigned) == sgd_before);

  // Each copy, stepping its own copy of the model, matches the source stepping the model.
  flat_model<float> a = model, b = model, c = model, d = model, e = model;
  for (int t = 3; t < 6; ++t) {
    for (auto* m : {&a, &b, &c, &d, &e}) set_gradients(*m, t);
    source.step(a);
    constructed.step(b);
    assigned.step(c);
    sgd_source.step(d);
    sgd_assigned.step(e);
  }
  BOOST_TEST(same_bits(a, b));
  BOOST_TEST(same_bits(a, c));
  BOOST_TEST(same_bits(d, e));
  BOOST_TEST(saved(assigned) == saved(source));
  BOOST_TEST(saved(sgd_assigned) == saved(sgd_source));

  // The copies are independent: stepping one changes no other.
  const auto source_now = saved(source);
  set_gradients(b, 9);
  constructed.step(b);
  BOOST_TEST(saved(source) == source_now);
  BOOST_TEST(saved(assigned) == source_now);
  BOOST_TEST(saved(constructed) != source_now);
  BOOST_TEST(sgd_constructed.state_digest() != sgd_source.state_digest());  // the source stepped on, the copy did not

  // A moved-from optimiser's state went to the target.
  optim::adam<float> moved{std::move(constructed)};
  BOOST_TEST(moved.steps() == 7);
}

// The device path on the test device: the state is uploaded at the first step of a replica on a
// device, stays there (every update finds it in that device's memory), is read through the host by
// save and state_digest, comes back to the host for a step on the calling thread, and moves to the
// device of whichever replica steps a copy. Through all of it the bits equal a CPU-only run.
BOOST_AUTO_TEST_CASE(state_follows_the_model_to_its_device) {
  const host_memory_device gpu0{0, 1}, gpu1{1, 2}, gpu0_other_stream{0, 3};
  auto live_on = [](const host_memory_device& d) {
    return std::count_if(device_buffers().begin(), device_buffers().end(),
                         [&](const auto& kv) { return kv.second == d; });
  };
  flat_model<float> reference({4, 1, 7}), model = reference;
  optim::adam<float> cpu_adam{{.lr = 0.02, .weight_decay = 1e-2}}, dev_adam{cpu_adam.options()};
  optim::sgd<float> cpu_sgd{{.lr = 0.02, .momentum = 0.5}}, dev_sgd{cpu_sgd.options()};
  host_memory_replica r0{gpu0};
  int t = 0;
  auto step_both = [&](auto&& step_device, int steps) {
    for (int k = 0; k < steps; ++k, ++t) {
      set_gradients(reference, t);
      set_gradients(model, t);
      cpu_adam.step(reference);
      cpu_sgd.step(reference);
      step_device();
    }
  };
  // A fresh state: uploaded on the first step, two moments of three parameters plus a velocity.
  step_both(
      [&] {
        dev_adam.step(r0, model);
        dev_sgd.step(r0, model);
      },
      3);
  BOOST_TEST(same_bits(reference, model));
  BOOST_TEST(live_on(gpu0) == 9);
  BOOST_TEST(r0.e.state_checks == 3 * (2 * 3 + 3));
  // Read through the host: the same bytes and digests as the CPU run's.
  BOOST_TEST(saved(dev_adam) == saved(cpu_adam));
  BOOST_TEST(saved(dev_sgd) == saved(cpu_sgd));
  BOOST_TEST(dev_adam.state_digest() == cpu_adam.state_digest());
  BOOST_TEST(dev_sgd.state_digest() == cpu_sgd.state_digest());

  // A step on the calling thread brings the state back to the host.
  step_both(
      [&] {
        dev_adam.step(model);
        dev_sgd.step(model);
      },
      1);
  BOOST_TEST(same_bits(reference, model));
  BOOST_TEST(live_on(gpu0) == 0);
  // And the next device step uploads it again.
  step_both(
      [&] {
        dev_adam.step(r0, model);
        dev_sgd.step(r0, model);
      },
      2);
  BOOST_TEST(same_bits(reference, model));
  BOOST_TEST(live_on(gpu0) == 9);

  // A copy assigned from the device-held state holds host state, and moves to the device of the
  // replica that steps it (another device, or the same one under another stream), never the source's.
  for (const auto& target : {gpu1, gpu0_other_stream}) {
    optim::adam<float> copy;
    copy = dev_adam;
    optim::sgd<float> sgd_copy{dev_sgd};
    BOOST_TEST(live_on(target) == 0);
    BOOST_TEST(copy.state_digest() == dev_adam.state_digest());
    host_memory_replica r1{target};
    flat_model<float> copy_model = model, source_model = model;
    for (int k = 0; k < 2; ++k) {
      set_gradients(copy_model, 100 + k);
      set_gradients(source_model, 100 + k);
      copy.step(r1, copy_model);
      sgd_copy.step(r1, copy_model);
    }
    // The same steps taken by a host copy of the source.
    optim::adam<float> host_adam = dev_adam;
    optim::sgd<float> host_sgd = dev_sgd;
    for (int k = 0; k < 2; ++k) {
      set_gradients(source_model, 100 + k);
      host_adam.step(source_model);
      host_sgd.step(source_model);
    }
    BOOST_TEST(same_bits(copy_model, source_model));
    BOOST_TEST(live_on(target) == 9);
    BOOST_TEST(live_on(gpu0) == 9);  // the source's own state stayed where it was
    BOOST_TEST(r1.e.state_checks == 2 * (2 * 3 + 3));
  }

  // State held by one device that steps a model on another, or on the same device under another
  // stream, moves there (through the host), and the bits stay the CPU run's.
  for (const auto& target : {gpu1, gpu0_other_stream, gpu0}) {
    host_memory_replica rt{target};
    step_both(
        [&] {
          dev_adam.step(rt, model);
          dev_sgd.step(rt, model);
        },
        1);
    BOOST_TEST(same_bits(reference, model));
    BOOST_TEST(live_on(target) == 9);
    BOOST_TEST(device_buffers().size() == 9u);  // and nowhere else
    BOOST_TEST(rt.e.state_checks == 2 * 3 + 3);
  }

  // A state loaded from a checkpoint (written by the CPU run) is uploaded at the next device step;
  // one written on the device loads into a CPU run.
  optim::adam<float> loaded{cpu_adam.options()}, back_on_cpu{cpu_adam.options()};
  optim::sgd<float> sgd_loaded{cpu_sgd.options()}, sgd_back_on_cpu{cpu_sgd.options()};
  load(loaded, saved(cpu_adam));
  load(sgd_loaded, saved(cpu_sgd));
  load(back_on_cpu, saved(dev_adam));
  load(sgd_back_on_cpu, saved(dev_sgd));
  flat_model<float> loaded_model = model, cpu_model = model;
  host_memory_replica r2{gpu1};
  for (int k = 0; k < 3; ++k, ++t) {
    for (auto* m : {&reference, &model, &loaded_model, &cpu_model}) set_gradients(*m, t);
    cpu_adam.step(reference);
    cpu_sgd.step(reference);
    dev_adam.step(r0, model);
    dev_sgd.step(r0, model);
    loaded.step(r2, loaded_model);
    sgd_loaded.step(r2, loaded_model);
    back_on_cpu.step(cpu_model);
    sgd_back_on_cpu.step(cpu_model);
  }
  BOOST_TEST(same_bits(reference, model));
  BOOST_TEST(same_bits(reference, loaded_model));
  BOOST_TEST(same_bits(reference, cpu_model));
  BOOST_TEST(saved(loaded) == saved(cpu_adam));
  BOOST_TEST(saved(back_on_cpu) == saved(cpu_adam));
  // Loading writes device-held state of the same sizes in place (memory a CUDA graph may have
  // captured stays where it is); state of other sizes replaces it with host state.
  std::vector<const void*> before;
  for (const auto& [ptr, where] : device_buffers()) before.push_back(ptr);
  load(dev_adam, saved(cpu_adam));
  load(dev_sgd, saved(cpu_sgd));
  BOOST_TEST(live_on(gpu0) == 9);
  std::vector<const void*> after;
  for (const auto& [ptr, where] : device_buffers()) after.push_back(ptr);
  BOOST_TEST(before == after);
  BOOST_TEST(saved(dev_adam) == saved(cpu_adam));
  BOOST_TEST(saved(dev_sgd) == saved(cpu_sgd));
  {
    optim::adam<float> other;
    flat_model<float> two({2});
    set_gradients(two, 0);
    other.step(two);
    load(dev_adam, saved(other));
    BOOST_TEST(live_on(gpu0) == 3);  // the velocity
    load(dev_sgd, saved(optim::sgd<float>{}));
    BOOST_TEST(live_on(gpu0) == 0);
  }

  // The state must match the model on the device path too, with the same error.
  flat_model<float> small({3}), large({4});
  optim::adam<float> opt;
  optim::sgd<float> sgd{{.momentum = 0.9}};
  opt.step(r0, small);
  sgd.step(r0, small);
  auto is_mismatch = [](const std::invalid_argument& e) { return std::string(e.what()) == mismatch_message; };
  BOOST_CHECK_EXCEPTION(opt.step(r0, large), std::invalid_argument, is_mismatch);
  BOOST_CHECK_EXCEPTION(sgd.step(r0, large), std::invalid_argument, is_mismatch);
  // And a host state that moves to a device is checked against the model there.
  optim::adam<float> host_state;
  host_state.step(small);
  BOOST_CHECK_EXCEPTION(host_state.step(r0, large), std::invalid_argument, is_mismatch);
}

// The capturable form (`capturable = true`, for steps captured into CUDA graphs): the step count and
// learning rate live with the state and the bias corrections are computed there, by a kernel of the
// step. Stepped on the calling thread and on the test device, through learning-rate changes, it
// gives the default form's bits, saves the same bytes, and loads either form's state. A capturing
// engine refuses the default form, before it counts the step, and runs the capturable one.
BOOST_AUTO_TEST_CASE(capturable_optimisers_step_as_the_default_form) {
  const host_memory_device gpu0{0, 1};
  auto live_on = [&] {
    return std::count_if(device_buffers().begin(), device_buffers().end(),
                         [&](const auto& kv) { return kv.second == gpu0; });
  };
  const optim::adam_options ao{.lr = 0.02, .weight_decay = 1e-2};
  const optim::sgd_options so{.lr = 0.03, .momentum = 0.5};
  optim::adam<float> adam{ao}, host_adam{{.lr = 0.02, .weight_decay = 1e-2, .capturable = true}},
      dev_adam{host_adam.options()};
  optim::sgd<float> sgd{so}, host_sgd{{.lr = 0.03, .momentum = 0.5, .capturable = true}}, dev_sgd{host_sgd.options()};
  flat_model<float> reference({4, 1, 7}), on_host = reference, on_device = reference;
  host_memory_replica r0{gpu0};
  std::vector<const void*> scalars_before;
  for (int t = 0; t < 6; ++t) {
    if (t == 3) {
      for (const auto& [ptr, where] : device_buffers()) scalars_before.push_back(ptr);
      const device_traffic before = traffic();
      for (auto* o : {&adam, &host_adam, &dev_adam}) o->set_lr(0.005);
      for (auto* o : {&sgd, &host_sgd, &dev_sgd}) o->set_lr(0.01);
      std::vector<const void*> now;
      for (const auto& [ptr, where] : device_buffers()) now.push_back(ptr);
      BOOST_TEST(now == scalars_before);  // written in place on the device
      // One element written on the device per optimiser there, nothing read back or copied up (on
      // a GPU each of those would wait for the stream).
      BOOST_TEST(traffic().fills - before.fills == 2);
      BOOST_TEST(traffic().reads == before.reads);
      BOOST_TEST(traffic().copies_up == before.copies_up);
    }
    for (auto* m : {&reference, &on_host, &on_device}) set_gradients(*m, t);
    adam.step(reference);
    sgd.step(reference);
    host_adam.step(on_host);
    host_sgd.step(on_host);
    dev_adam.step(r0, on_device);
    dev_sgd.step(r0, on_device);
    BOOST_TEST(same_bits(reference, on_host), "step " << t);
    BOOST_TEST(same_bits(reference, on_device), "step " << t);
  }
  BOOST_TEST(live_on() == 3 * 3 + 2);  // moments, velocity, and each optimiser's scalars
  BOOST_TEST(host_adam.steps() == 6);
  BOOST_TEST(dev_adam.steps() == 6);
  BOOST_TEST(dev_sgd.steps() == 6);
  BOOST_TEST(saved(host_adam) == saved(adam));
  BOOST_TEST(saved(dev_adam) == saved(adam));
  BOOST_TEST(saved(dev_sgd) == saved(sgd));
  BOOST_TEST(dev_adam.state_digest() == adam.state_digest());
  BOOST_TEST(dev_sgd.state_digest() == sgd.state_digest());

  // Either form's state loads into the other and steps on with the same bits (the loaded step count
  // drives the bias corrections; the learning rate is the optimiser's own).
  optim::adam<float> default_loaded{{.lr = 0.005, .weight_decay = 1e-2}}, capturable_loaded{dev_adam.options()};
  load(default_loaded, saved(dev_adam));
  load(capturable_loaded, saved(adam));
  flat_model<float> a = reference, b = reference;
  for (int t = 6; t < 8; ++t) {
    for (auto* m : {&reference, &a, &b}) set_gradients(*m, t);
    adam.step(reference);
    default_loaded.step(a);
    capturable_loaded.step(r0, b);
  }
  BOOST_TEST(same_bits(reference, a));
  BOOST_TEST(same_bits(reference, b));
  BOOST_TEST(capturable_loaded.steps() == 8);

  // While the engine captures: the default form refuses, naming itself and the remedy, and counts
  // nothing; the capturable form steps.
  r0.e.capturing_now = true;
  const auto steps_before = adam.steps();
  auto refusal = [](const char* who) {
    return [who](const dist::graph_capture_error& e) {
      return dist::test::mentions(e.what(), who) && dist::test::mentions(e.what(), "capturable = true");
    };
  };
  BOOST_CHECK_EXCEPTION(adam.step(r0, a), dist::graph_capture_error, refusal("optim::adam"));
  BOOST_CHECK_EXCEPTION(sgd.step(r0, a), dist::graph_capture_error, refusal("optim::sgd"));
  BOOST_TEST(adam.steps() == steps_before);
  dev_adam.step(r0, on_device);
  BOOST_TEST(dev_adam.steps() == 7);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(gradients)

BOOST_AUTO_TEST_CASE(fused_buckets_sum_every_gradient) {
  // Sizes in floats: 1000 (4000 B), 10, 3000 (12000 B), 0 (skipped), 500.
  const std::vector<std::size_t> sizes{1000, 10, 3000, 0, 500};
  struct row {
    std::size_t bucket_bytes, collectives;
  };
  for (const row t : {row{std::size_t{25} << 20, 1}, row{0, 4}, row{4040, 3}, row{16000, 2}}) {
    for (auto op : {dist::reduce_op::sum, dist::reduce_op::mean}) {
      dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
      auto models = s.mirror([&](auto&) { return flat_model<float>(sizes); });
      auto counts = s.run(
          [&](dist::replica auto& r, flat_model<float>& m) {
            for (std::size_t p = 0; p < m.grads.size(); ++p)
              for (std::size_t i = 0; i < m.grads[p].size(); ++i)
                m.grads[p][i] =
                    static_cast<float>((r.replica_id() + 1) * (static_cast<int>(p) + 1)) + static_cast<float>(i % 7);
            return r.all_reduce_gradients(m, {.op = op, .bucket_bytes = t.bucket_bytes});
          },
          models);
      for (auto c : counts) BOOST_TEST(c == t.collectives, "bucket cap " << t.bucket_bytes);
      for (const auto& m : models)
        for (std::size_t p = 0; p < sizes.size(); ++p)
          for (std::size_t i = 0; i < sizes[p]; ++i) {
            // (1 + 2 + 3)(p + 1) + 3 (i % 7), divided by 3 for a mean.
            const float sum = 6.0f * static_cast<float>(p + 1) + 3.0f * static_cast<float>(i % 7);
            const float expected = op == dist::reduce_op::mean ? sum / 3.0f : sum;
            if (m.grads[p][i] != expected) {
              BOOST_TEST(m.grads[p][i] == expected, "parameter " << p << " element " << i);
              return;
            }
          }
    }
  }
}

BOOST_AUTO_TEST_CASE(under_one_device_it_does_nothing) {
  dist::one_device_strategy<> s;
  auto models = s.mirror([](auto&) { return flat_model<float>({4, 4}); });
  models[0].grads[1] = {1, 2, 3, 4};
  auto counts = s.run([](dist::replica auto& r, flat_model<float>& m) { return r.all_reduce_gradients(m); }, models);
  BOOST_TEST(counts[0] == 0u);
  BOOST_TEST(models[0].grads[1] == (std::vector<float>{1, 2, 3, 4}));
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

constexpr std::int64_t global_batch = 12, in_size = 1 * 6 * 6, out_size = 2 * 3 * 3;

// conv (no bias: a norm follows) -> Norm -> relu -> conv stride 2, reflection padding -> tanh.
template <template <class> class Norm>
auto make_net(std::uint64_t seed) {
  return nn::sequential{
      nn::conv2d<float>{{.in_channels = 1, .out_channels = 4, .kernel = 3, .stride = 1, .padding = 1, .bias = false},
                        seed},
      Norm<float>{{.channels = 4}, seed + 1}, nn::relu<float>{},
      nn::conv2d<float>{{.in_channels = 4,
                         .out_channels = 2,
                         .kernel = 3,
                         .stride = 2,
                         .padding = 1,
                         .pad_mode = nn::padding_mode::reflect},
                        seed + 2},
      nn::tanh<float>{}};
}

struct training_data {
  std::vector<float> x, y;
};
training_data make_data() {
  training_data d;
  const auto x = dist::test::random_tensor<float>(shape::nchw(global_batch, 1, 6, 6), 71, -1.0, 2.0);
  const auto y = dist::test::random_tensor<float>(shape::nchw(global_batch, 2, 3, 3), 72, -0.5, 0.5);
  d.x.assign(x.begin(), x.end());
  d.y.assign(y.begin(), y.end());
  return d;
}

// Five Adam steps on the same global batch of 12; returns replica 0's parameters, one vector per
// tensor, after checking that every replica holds the same bits.
// The loss convention: `global` divides by the global batch and sums the gradients (the default);
// `per_replica` averages over each replica's own examples and all-reduces with mean.
enum class scaling { global, per_replica };

template <template <class> class Norm, class S>
std::vector<std::vector<float>> train(S& s, scaling how = scaling::global, int steps = 5,
                                      std::int64_t batch = global_batch) {
  auto data = make_data();
  data.x.resize(static_cast<std::size_t>(batch * in_size));  // the first `batch` examples
  data.y.resize(static_cast<std::size_t>(batch * out_size));
  using net_type = decltype(make_net<Norm>(0));
  auto nets = s.mirror([](auto&) { return make_net<Norm>(1234); });
  auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
  auto xs = s.scatter(data.x, in_size);
  auto ys = s.scatter(data.y, out_size);
  for (int step = 0; step < steps; ++step) {
    auto losses = s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, net_type& net,
            optim::adam<float>& opt) {
          const auto n = static_cast<std::int64_t>(xl.size()) / in_size;
          const tensor<float> x{shape::nchw(n, 1, 6, 6), xl}, y{shape::nchw(n, 2, 3, 3), yl};
          net.zero_grad();
          const auto out = net.forward(r, x);
          if (how == scaling::per_replica) {
            const auto loss = nn::mse(out, y, n);
            net.backward(r, loss.grad);
            r.all_reduce_gradients(net, {.op = dist::reduce_op::mean});
            opt.step(net);
            return loss.value / static_cast<float>(r.num_replicas());
          }
          const auto loss = nn::mse(out, y, batch);  // a share of the mean over the GLOBAL batch
          net.backward(r, loss.grad);
          r.all_reduce_gradients(net);  // the sum of the shares
          opt.step(net);
          return loss.value;
        },
        xs, ys, nets, opts);
    BOOST_TEST(std::isfinite(s.reduce(dist::reduce_op::sum, losses)));
  }
  if constexpr (std::is_same_v<net_type, decltype(make_net<nn::batch_norm>(0))>) {
    // Plain batch norm's running statistics are each replica's own: the copies differ in their
    // buffers (checked below: their parameters agree).
    if (s.num_replicas_in_sync() > 1) BOOST_CHECK_THROW(s.verify_mirrored(nets), dist::mirrored_divergence);
  } else {
    s.verify_mirrored(nets);  // the digests of every replica's parameters and running statistics agree
  }
  std::vector<std::vector<std::vector<float>>> per_replica;
  for (auto& net : nets) {
    per_replica.emplace_back();
    net.for_each_parameter(
        [&](std::span<float> v, std::span<float>) { per_replica.back().emplace_back(v.begin(), v.end()); });
  }
  for (std::size_t q = 1; q < per_replica.size(); ++q)
    BOOST_TEST((per_replica[q] == per_replica[0]), "replica " << q << " drifted from replica 0");
  return per_replica[0];
}

double worst_relative_error(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  BOOST_TEST_REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, dist::test::relative_error_of<float>(a[i], b[i]));
  return worst;
}

std::vector<std::vector<float>> initial_parameters() {
  auto net = make_net<nn::sync_batch_norm>(1234);
  std::vector<std::vector<float>> p;
  net.for_each_parameter([&](std::span<float> v, std::span<float>) { p.emplace_back(v.begin(), v.end()); });
  return p;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(equivalence)

BOOST_AUTO_TEST_CASE(sync_batch_norm_training_matches_one_device) {
  dist::one_device_strategy<> one;
  const auto reference = train<nn::sync_batch_norm>(one);
  // Training moved the parameters well beyond the tolerance, so agreement below means something.
  BOOST_TEST(worst_relative_error(reference, initial_parameters()) > 1e-2);
  // 12 examples split 12; 6+6; 4+4+4; 3+3+3+3; and unevenly 3+3+2+2+2.
  for (int n = 1; n <= 5; ++n) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    const double err = worst_relative_error(train<nn::sync_batch_norm>(s), reference);
    BOOST_TEST(err < 1e-4, n << " replicas: parameters differ from one device by " << err << " (relative)");
    BOOST_TEST_MESSAGE("sync_batch_norm, " << n << " replicas: worst relative parameter difference " << err);
  }
}

BOOST_AUTO_TEST_CASE(plain_batch_norm_does_not) {
  dist::one_device_strategy<> one;
  const auto reference = train<nn::batch_norm>(one);
  for (int n = 2; n <= 4; ++n) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    const double err = worst_relative_error(train<nn::batch_norm>(s), reference);
    BOOST_TEST(err > 1e-3, n << " replicas: plain batch norm differs from one device by only " << err);
    BOOST_TEST_MESSAGE("batch_norm, " << n << " replicas: worst relative parameter difference " << err);
  }
}

BOOST_AUTO_TEST_CASE(layers_without_batch_statistics_match_one_device) {
  dist::one_device_strategy<> one;
  const auto reference = train<nn::instance_norm>(one);
  for (int n : {2, 3}) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    const double err = worst_relative_error(train<nn::instance_norm>(s), reference);
    BOOST_TEST(err < 1e-4, n << " replicas: " << err);
  }
}

BOOST_AUTO_TEST_CASE(a_replica_without_examples_takes_part) {
  // A global batch of 3 over 4 replicas: 1, 1, 1 and 0 examples. The empty replica still joins
  // every collective (sync_batch_norm's and the gradients') with a zero contribution.
  dist::one_device_strategy<> one;
  const auto reference = train<nn::sync_batch_norm>(one, scaling::global, 5, 3);
  dist::mirrored_strategy<> s{dist::cpu_replicas(4)};
  const double err = worst_relative_error(train<nn::sync_batch_norm>(s, scaling::global, 5, 3), reference);
  BOOST_TEST(err < 1e-4, "3 examples over 4 replicas: " << err);
}

BOOST_AUTO_TEST_CASE(verify_mirrored_sees_a_drifted_parameter) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
  auto nets = s.mirror([](auto&) { return make_net<nn::sync_batch_norm>(7); });
  s.verify_mirrored(nets);
  nets[2].get<0>().weight().value[5] += 1e-7f;
  BOOST_CHECK_THROW(s.verify_mirrored(nets), dist::mirrored_divergence);
}

// The message of verify_mirrored's divergence ("no divergence" if it passes).
template <class S, class V>
std::string divergence_of(const S& s, const V& mirrored) {
  try {
    s.verify_mirrored(mirrored);
  } catch (const dist::mirrored_divergence& e) {
    return e.what();
  }
  return "no divergence";
}
using distribute::test::mentions;

BOOST_AUTO_TEST_CASE(verify_mirrored_sees_diverged_running_statistics) {
  // Plain batch norm takes its statistics, running ones included, from the replica's own examples:
  // forward passes in training mode over different shares leave the parameters identical and the
  // running mean and variance different on every replica.
  dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
  auto nets = s.mirror([](auto&) { return make_net<nn::batch_norm>(7); });
  s.verify_mirrored(nets);
  const auto data = make_data();
  const auto xs = s.scatter(data.x, in_size);
  auto forward = [&](auto& models) {
    s.run(
        [](dist::replica auto& r, const std::vector<float>& xl, auto& m) {
          (void)m.forward(r, tensor<float>{shape::nchw(static_cast<std::int64_t>(xl.size()) / in_size, 1, 6, 6), xl});
        },
        xs, models);
  };
  forward(nets);
  for (auto& net : nets) BOOST_TEST(nn::parameter_digest(net) == nn::parameter_digest(nets[0]));
  BOOST_TEST(nets[1].get<1>().running_mean() != nets[0].get<1>().running_mean());
  const auto what = divergence_of(s, nets);
  BOOST_TEST(mentions(what, "on replica(s) 1, 2"), what);
  BOOST_TEST(mentions(what, "buffers (such as batch norm's running statistics) differ on replica(s) 1, 2"), what);
  BOOST_TEST(!mentions(what, "parameters differ"), what);
  // broadcast copies the primary's buffers with its parameters.
  s.broadcast(nets);
  s.verify_mirrored(nets);
  BOOST_TEST(nets[2].get<1>().running_var() == nets[0].get<1>().running_var());
  // A drifted parameter on one replica, drifted statistics on another: the message tells them apart.
  nets[1].get<0>().weight().value[0] += 1e-7f;
  nets[2].for_each_buffer([](std::span<double> b) { b[0] += 1e-12; });
  const auto both = divergence_of(s, nets);
  BOOST_TEST(mentions(both, "on replica(s) 1, 2; parameters differ on replica(s) 1; buffers"), both);
  BOOST_TEST(mentions(both, "running statistics) differ on replica(s) 2"), both);
  s.broadcast(nets, 2);
  s.verify_mirrored(nets);

  // SyncBatchNorm takes the global batch's statistics: its copies stay identical, buffers included.
  auto synced = s.mirror([](auto&) { return make_net<nn::sync_batch_norm>(7); });
  forward(synced);
  s.verify_mirrored(synced);
  // A layer on its own is a model too (digested by its parameters and buffers).
  auto layers = s.mirror([](auto&) { return nn::batch_norm<float>{{.channels = 1}, 3}; });
  forward(layers);
  BOOST_TEST(mentions(divergence_of(s, layers), "buffers"));
  s.broadcast(layers, 1);
  s.verify_mirrored(layers);
}

BOOST_AUTO_TEST_CASE(per_replica_mean_losses_need_an_even_split) {
  // Losses averaged per replica with a mean all-reduce: right for an even split (12 over 2, 3, 4),
  // wrong for an uneven one (12 over 5: 3, 3, 2, 2, 2), where the global rule stays right.
  dist::one_device_strategy<> one;
  const auto reference = train<nn::instance_norm>(one);
  for (int n : {2, 3, 4}) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    const double err = worst_relative_error(train<nn::instance_norm>(s, scaling::per_replica), reference);
    BOOST_TEST(err < 1e-4, n << " replicas, even split: " << err);
  }
  dist::mirrored_strategy<> five{dist::cpu_replicas(5)};
  const double uneven = worst_relative_error(train<nn::instance_norm>(five, scaling::per_replica), reference);
  BOOST_TEST(uneven > 1e-3, "5 replicas, uneven split, per-replica means: only " << uneven);
  const double global = worst_relative_error(train<nn::instance_norm>(five), reference);
  BOOST_TEST(global < 1e-4, "5 replicas, uneven split, global rule: " << global);
  BOOST_TEST_MESSAGE("uneven split: per-replica means differ by " << uneven << ", the global rule by " << global);
}

BOOST_AUTO_TEST_CASE(two_runs_with_the_same_seed_are_bit_identical) {
  for (int n : {1, 3, 4}) {
    dist::mirrored_strategy<> a{dist::cpu_replicas(n)}, b{dist::cpu_replicas(n)};
    const auto first = train<nn::sync_batch_norm>(a), second = train<nn::sync_batch_norm>(b);
    BOOST_TEST((first == second), n << " replicas");
  }
  dist::one_device_strategy<> one;
  BOOST_TEST((train<nn::sync_batch_norm>(one) == train<nn::sync_batch_norm>(one)));
}

BOOST_AUTO_TEST_SUITE_END()
