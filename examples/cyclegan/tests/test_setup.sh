# Sourced by the example's script tests: skips (77) where Fashion-MNIST is not installed, then makes
# the test's work directory ($work) afresh.
fmnist=/usr/share/datasets/fashion-mnist
if [[ ! -e $fmnist/train-images-idx3-ubyte.gz && ! -e $fmnist/train-images-idx3-ubyte ]]; then
  echo "Fashion-MNIST not found in $fmnist (apt-get install dataset-fashion-mnist): skipped"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
