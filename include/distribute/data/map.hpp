#pragma once
// Element-wise transforms: `map` and `filter`.

#include <distribute/data/dataset.hpp>

#include <functional>
#include <optional>
#include <type_traits>
#include <utility>

namespace distribute::data {

namespace detail {
// g after f, so that map(f).map(g) is one stage (the stage a parallel prefetch runs on its threads).
template <class F, class G>
struct composed {
  F f;
  G g;
  template <class X>
  decltype(auto) operator()(X&& x) const {
    return std::invoke(g, std::invoke(f, std::forward<X>(x)));
  }
};
}  // namespace detail

template <dataset D, class F>
class map_dataset : public dataset_base<map_dataset<D, F>> {
 public:
  using input_type = D;
  using function_type = F;
  using element_type = std::decay_t<std::invoke_result_t<const F&, element_t<D>&&>>;

  map_dataset(D input, F fn) : input_(std::move(input)), fn_(std::move(fn)) {}

  class cursor_type {
   public:
    cursor_type(cursor_t<D> in, F fn) : in_(std::move(in)), fn_(std::move(fn)) {}
    std::optional<element_type> next() {
      if (auto e = in_.next()) return std::optional<element_type>(std::invoke(fn_, std::move(*e)));
      return std::nullopt;
    }

   private:
    cursor_t<D> in_;
    F fn_;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {input_.cursor(epoch), fn_}; }
  std::int64_t cardinality() const { return input_.cardinality(); }

  // map of a map fuses into one stage.
  template <class G>
  auto map(G g) const {
    using H = detail::composed<F, G>;
    return map_dataset<D, H>(input_, H{fn_, std::move(g)});
  }

  std::size_t file_count() const
    requires file_shardable<D>
  {
    return input_.file_count();
  }
  map_dataset shard_files(std::size_t index, std::size_t count) const
    requires file_shardable<D>
  {
    return {input_.shard_files(index, count), fn_};
  }

  const D& input() const noexcept { return input_; }
  const F& function() const noexcept { return fn_; }

 private:
  D input_;
  F fn_;
};

template <class D>
inline constexpr bool is_map_dataset_v = false;
template <class D, class F>
inline constexpr bool is_map_dataset_v<map_dataset<D, F>> = true;

template <dataset D, class P>
class filter_dataset : public dataset_base<filter_dataset<D, P>> {
 public:
  using element_type = element_t<D>;

  filter_dataset(D input, P pred) : input_(std::move(input)), pred_(std::move(pred)) {}

  class cursor_type {
   public:
    cursor_type(cursor_t<D> in, P pred) : in_(std::move(in)), pred_(std::move(pred)) {}
    std::optional<element_type> next() {
      while (auto e = in_.next())
        if (std::invoke(pred_, std::as_const(*e))) return e;
      return std::nullopt;
    }

   private:
    cursor_t<D> in_;
    P pred_;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {input_.cursor(epoch), pred_}; }
  std::int64_t cardinality() const {
    return input_.cardinality() == infinite_cardinality ? infinite_cardinality : unknown_cardinality;
  }

  std::size_t file_count() const
    requires file_shardable<D>
  {
    return input_.file_count();
  }
  filter_dataset shard_files(std::size_t index, std::size_t count) const
    requires file_shardable<D>
  {
    return {input_.shard_files(index, count), pred_};
  }

 private:
  D input_;
  P pred_;
};

}  // namespace distribute::data
