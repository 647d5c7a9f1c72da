// The Python module _actlab (wrapped by python/actlab/__init__.py): the activation-cache policies'
// pack and unpack on NumPy arrays, training runs and one-step memory measurements. Every call goes
// through the same library functions the apps use; errors arrive in Python as RuntimeError with the
// library's message. Tested in python/tests/test_actlab.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>

#include "actlab/compress/policy.h"
#include "actlab/core/allocator.h"
#include "actlab/core/error.h"
#include "actlab/io/safetensors.h"
#include "actlab/models/registry.h"
#include "actlab/train/checkpoint.h"
#include "actlab/train/config_file.h"
#include "actlab/train/logging.h"
#include "actlab/train/memtable.h"
#include "actlab/train/trainer.h"

namespace py = pybind11;
using namespace actlab;

namespace {

// What pack() returns: the policy's packed form of one array, held until unpack().
struct PyPacked {
  std::shared_ptr<const ActivationCachePolicy> policy;
  std::unique_ptr<Packed> packed;
  SaveInfo info;
  size_t nbytes() const { return packed->nbytes(); }
  Shape shape() const { return packed->shape(); }
};

// A float32 array as an actlab tensor. The bytes are copied once into actlab's tracked memory, so the
// allocator's figures (and a policy that keeps the tensor itself, exact) stay true.
Tensor tensor_from(const py::array_t<float, py::array::c_style | py::array::forcecast>& a) {
  Shape shape(a.shape(), a.shape() + a.ndim());
  Tensor t = Tensor::empty(shape, DType::F32);
  if (t.numel() > 0) std::memcpy(t.data<float>(), a.data(), t.nbytes());
  return t;
}

// An array over the tensor's own buffer, no copy: the capsule keeps the tensor alive.
py::array array_of(const Tensor& t) {
  auto* keep = new Tensor(t.contiguous());
  py::capsule owner(keep, [](void* p) { delete static_cast<Tensor*>(p); });
  std::vector<py::ssize_t> shape(keep->shape().begin(), keep->shape().end());
  return py::array_t<float>(shape, keep->data<float>(), owner);
}

// The array's own buffer as a tensor, no copy, for a policy that only reads it (every lossy one: they
// keep codes, or a copy for shapes they cannot view). The owner holds a reference to the array and
// drops it under the GIL, whichever thread lets the storage go.
Tensor tensor_over(const py::array_t<float, py::array::c_style | py::array::forcecast>& a) {
  Shape shape(a.shape(), a.shape() + a.ndim());
  std::shared_ptr<void> owner(new py::object(a), [](void* o) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(o);
  });
  return Tensor::borrow(const_cast<float*>(a.data()), shape, DType::F32, std::move(owner));
}

PyPacked pack(const py::array_t<float, py::array::c_style | py::array::forcecast>& a, const std::string& policy,
              uint64_t seed, uint64_t stream) {
  PyPacked p;
  p.policy = parse_policy(policy);
  p.info = {"python", "input", true, ""};
  // exact keeps the tensor itself: a copy, so that later writes to the array cannot reach it.
  const Tensor x = p.policy->is_exact() ? tensor_from(a) : tensor_over(a);
  MemTagScope tag(MemTag::ActivationPacked);
  p.packed = p.policy->pack(x, p.info, {seed, stream});
  return p;
}

// train(key=value, ...): the keys of actlab-train's option table (with '_' for '-'); returns the summary.
py::object train_run(const py::kwargs& kwargs) {
  TrainConfig c;
  c.quiet = true;
  for (const auto& kv : kwargs) {
    std::string key = py::str(kv.first);
    for (char& ch : key) ch = ch == '_' ? '-' : ch;
    const py::handle v = kv.second;
    if (key == "policy-rule" && py::isinstance<py::list>(v)) {
      for (const auto& r : v.cast<py::list>()) set_config_value(c, key, py::str(r));
    } else if (py::isinstance<py::bool_>(v)) {
      set_config_value(c, key, v.cast<bool>() ? "true" : "false");
    } else {
      set_config_value(c, key, py::str(v));
    }
  }
  TrainSummary s;
  {
    py::gil_scoped_release release;  // a run takes minutes; other Python threads go on
    s = train(c);
  }
  return py::module_::import("json").attr("loads")(summary_to_json(s, c));
}

// forward(model, images, weights, classes): the named model's logits for a batch in evaluation mode, its
// weights from a plain safetensors state dict (torchvision/timm names, as --init-weights takes) or a fresh
// initialisation from seed. For checking actlab's models against another framework's with the same weights.
py::array forward(const std::string& model, const py::array_t<float, py::array::c_style | py::array::forcecast>& images,
                  const std::string& weights, int64_t classes, uint64_t seed) {
  ACTLAB_CHECK(images.ndim() == 4 && images.shape(2) == images.shape(3), "forward: images must be (N, C, S, S), got ",
               images.ndim(), " dims");
  const Tensor x = tensor_from(images);
  seed_init(seed);
  std::shared_ptr<Module> net = make_model({model, x.size(1), classes, x.size(2)});
  if (!weights.empty()) import_state_dict(read_safetensors(weights), *net, "weights '" + weights + "'");
  net->eval();
  Tensor logits;
  {
    py::gil_scoped_release release;
    NoGradGuard no_grad;
    logits = (*net)(Variable(x)).data();
  }
  return array_of(logits);
}

py::dict step_memory(const std::string& model, int64_t batch, const std::string& policy, int64_t image_size,
                     int64_t channels, int64_t classes, uint64_t seed) {
  StepMemoryConfig c;
  c.model = model;
  c.batch = batch;
  c.policy = policy;
  c.image_size = image_size;
  c.in_channels = channels;
  c.num_classes = classes;
  c.seed = seed;
  StepMemoryResult r;
  {
    py::gil_scoped_release release;
    r = measure_step_memory(c);
  }
  py::dict d;
  d["activation_bytes"] = r.activation_bytes;
  d["total_bytes"] = r.total_bytes;
  d["peak_bytes"] = r.peak_bytes;
  d["model_only_bytes"] = r.model_only_bytes;
  d["saved_raw_bytes"] = r.saved_raw_bytes;
  d["saved_packed_bytes"] = r.saved_packed_bytes;
  d["saved_expected_bytes"] = r.saved_expected_bytes;
  d["step_seconds"] = r.step_seconds;
  return d;
}

}  // namespace

PYBIND11_MODULE(_actlab, m) {
  m.doc() = "actlab: activation-compressed training (DIVISION and its baselines) from Python";
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);

  py::class_<PyPacked>(m, "Packed", "An array as a policy keeps it until unpack().")
      .def_property_readonly("nbytes", &PyPacked::nbytes, "bytes held (the packed form)")
      .def_property_readonly("shape", [](const PyPacked& p) { return py::tuple(py::cast(p.shape())); })
      .def_property_readonly("policy", [](const PyPacked& p) { return p.policy->name(); })
      .def("__repr__", [](const PyPacked& p) {
        return "<actlab.Packed " + p.policy->name() + " " + shape_str(p.shape()) + ", " +
               std::to_string(p.nbytes()) + " bytes>";
      });
  m.def("pack", &pack, py::arg("array"), py::arg("policy") = "division:B=8,Q=2", py::arg("seed") = 0,
        py::arg("stream") = 0,
        "Packs a float32 array (N, C, H, W) or any shape with the policy: stochastic rounding draws from "
        "Philox(seed, stream), so the same arguments give the same bytes as actlab's C++ and CUDA codecs.");
  m.def(
      "unpack", [](const PyPacked& p) { return array_of(p.policy->unpack(*p.packed, p.info)); }, py::arg("packed"),
      "The float32 array the policy reconstructs (no copy: the array owns actlab's buffer).");
  m.def(
      "expected_bytes",
      [](const std::string& policy, const std::vector<int64_t>& shape) {
        return parse_policy(policy)->expected_bytes(Shape(shape.begin(), shape.end()));
      },
      py::arg("policy"), py::arg("shape"), "The closed-form bytes the policy keeps for a float32 tensor of this shape.");
  m.def("policy_forms", &policy_forms, "The accepted policy strings, one per line.");
  m.def("train", &train_run,
        "Runs actlab-train with these options (actlab-train --help lists them; '_' stands for '-') and returns "
        "the summary as a dict. quiet defaults to True.");
  m.def("step_memory", &step_memory, py::arg("model") = "resnet20", py::arg("batch") = 128,
        py::arg("policy") = "division:B=8,Q=2", py::arg("image_size") = 32, py::arg("channels") = 3,
        py::arg("classes") = 10, py::arg("seed") = 0,
        "One training step's memory on random data, as actlab-memtable measures it (docs/measures.md).");
  m.def(
      "memory_stats", [] { return memory_stats().table(); }, "The allocator's table (bytes by tag) on the CPU.");
  m.def("forward", &forward, py::arg("model"), py::arg("images"), py::arg("weights") = "", py::arg("classes") = 10,
        py::arg("seed") = 0,
        "The model's logits for images (N, C, S, S) float32 in evaluation mode, with the weights of a plain "
        "safetensors state dict (torchvision/timm names) or a fresh initialisation from seed.");
}
