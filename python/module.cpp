// The Python module _actlab (wrapped by python/actlab/__init__.py): the activation-cache policies'
// pack and unpack on NumPy arrays, training runs and one-step memory measurements. Every call goes
// through the same library functions the apps use; errors arrive in Python as RuntimeError with the
// library's message. Tested in python/tests/test_actlab.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <unistd.h>

#include "actlab/compress/acgc.h"
#include "actlab/compress/policies.h"
#include "actlab/compress/policy.h"
#include "actlab/core/allocator.h"
#include "actlab/core/cpu/kernels.h"
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

// What pack() returns: the policy's packed form of one array, held until unpack(), and with keep_sign the
// array's sign as a 1-bit mask (bit i: element i > 0; cpu::mask_words layout), which unpack() restores.
struct PyPacked {
  std::shared_ptr<const ActivationCachePolicy> policy;
  std::unique_ptr<Packed> packed;
  SaveInfo info;
  Tensor sign;  // I32 words; undefined without keep_sign
  size_t nbytes() const { return packed->nbytes() + (sign.defined() ? sign.nbytes() : 0); }
  Shape shape() const { return packed->shape(); }
};

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

// `obj` (a NumPy array, a PyTorch CPU tensor, anything numpy.asarray takes) as a C-contiguous float32 array.
// Only float32 is taken: a silent cast would lose float64's precision under `exact`, drop a complex part or
// pack None as NaN. numpy.asarray's own error (a tensor that requires grad, a CUDA tensor) reaches Python.
FloatArray float32_array(const py::object& obj, const char* what) {
  py::array a;
  try {
    a = py::module_::import("numpy").attr("asarray")(obj);
  } catch (py::error_already_set& e) {  // a dtype NumPy has no type for (a bf16 torch tensor): say what to do
    if (!e.matches(PyExc_TypeError)) throw;
    throw py::type_error(std::string(what) + ": a float32 array is expected, and NumPy cannot read this one (" +
                         py::str(e.value()).cast<std::string>() + "); convert with .float() or .astype(numpy.float32)");
  }
  if (a.dtype().kind() != 'f' || a.dtype().itemsize() != 4)
    throw py::type_error(std::string(what) + ": a float32 array is expected, got dtype " +
                         py::str(a.dtype()).cast<std::string>() + " (convert with .astype(numpy.float32) or .float())");
  // float32 already: only a strided or byte-swapped array is copied, to native C order. NumPy makes that copy,
  // so a copy that cannot be allocated is its MemoryError (FloatArray::ensure returned an empty handle and
  // cleared the error, and the empty array was read: a broadcast of 2^40 elements crashed the process).
  const FloatArray c = FloatArray::ensure(a.attr("astype")("float32", py::arg("order") = "C", py::arg("copy") = false));
  if (!c) throw std::runtime_error(std::string(what) + ": NumPy gave no C-ordered float32 array for this input");
  return c;
}

// A float32 array as an actlab tensor. The bytes are copied once into actlab's tracked memory, so the
// allocator's figures (and a policy that keeps the tensor itself, exact) stay true.
Tensor tensor_from(const FloatArray& a) {
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
Tensor tensor_over(const FloatArray& a) {
  Shape shape(a.shape(), a.shape() + a.ndim());
  std::shared_ptr<void> owner(new py::object(a), [](void* o) {
    py::gil_scoped_acquire gil;
    delete static_cast<py::object*>(o);
  });
  return Tensor::borrow(const_cast<float*>(a.data()), shape, DType::F32, std::move(owner));
}

// One parsed policy per policy string, shared by every pack() that names it (under the GIL): parsing per
// call gave each pack its own policy object, which for swap is a copy thread per saved tensor and no
// prefetch across saves. Policies are safe to share: the trainer shares one across a whole run.
// A forked child (multiprocessing's default on Linux) inherits the cache but none of its policies' threads
// (swap's copy thread): its first swap unpack waited forever for a copy no thread would make. A child
// parses its own; the parent's objects are left alone, as their destructors would join threads that do
// not exist in this process.
// The cache holds the kCachedPolicies strings used last: a sweep over swap's F or P in one process kept a
// copy thread per string for the process's life. An evicted policy lives on in the packs that hold it.
constexpr size_t kCachedPolicies = 16;

std::shared_ptr<const ActivationCachePolicy> policy_of(const std::string& spec) {
  struct Entry {
    std::shared_ptr<const ActivationCachePolicy> policy;
    uint64_t used = 0;
  };
  using Cache = std::map<std::string, Entry>;
  static Cache cache;
  static uint64_t uses = 0;
  static pid_t owner = ::getpid();
  if (owner != ::getpid()) {
    (void)new Cache(std::move(cache));  // never destroyed, on purpose
    cache.clear();
    owner = ::getpid();
  }
  auto it = cache.find(spec);
  if (it == cache.end()) {
    auto policy = parse_policy(spec);  // a bad string evicts nothing
    // acgc picks each save's width from gradient measurements that only actlab's trainer makes (run_step's
    // sensitivity pass); a pack from Python never gets one, so it would code everything at its initial width.
    ACTLAB_CHECK(dynamic_cast<const AcgcPolicy*>(policy.get()) == nullptr, "'", spec,
                 "': acgc chooses its widths from actlab's own training loop, which a pack from Python does not run; "
                 "every array would be coded at its initial ", AcgcPolicy::kInitialBits,
                 " bits (pergroup with the same G and Q=", AcgcPolicy::kInitialBits, " is that layout by name)");
    // Under the GIL, which guards the cache (a swap policy's destructor joins its copy thread, which holds
    // only actlab tensors: it never waits for the GIL).
    if (cache.size() >= kCachedPolicies) {
      auto oldest = cache.begin();
      for (auto e = cache.begin(); e != cache.end(); ++e)
        if (e->second.used < oldest->second.used) oldest = e;
      cache.erase(oldest);
    }
    it = cache.emplace(spec, Entry{std::move(policy), 0}).first;
  }
  it->second.used = ++uses;
  return it->second.policy;
}

PyPacked pack(const py::object& array, const std::string& policy, uint64_t seed, uint64_t stream, bool keep_sign,
             int min_bits) {
  ACTLAB_CHECK(min_bits == 0 || min_bits == 1 || min_bits == 2 || min_bits == 4 || min_bits == 8,
               "pack: min_bits must be 0 (the policy's own width), 1, 2, 4 or 8, got ", min_bits);
  const FloatArray a = float32_array(array, "pack");
  PyPacked p;
  p.policy = policy_of(policy);
  p.info = {"python", "input", true, ""};
  p.info.min_bits = min_bits;
  MemTagScope tag(MemTag::ActivationPacked);  // exact's copy is what it keeps: tagged like every pack
  // exact keeps the tensor itself: a copy, so that later writes to the array cannot reach it.
  const Tensor x = p.policy->is_exact() ? tensor_from(a) : tensor_over(a);
  p.packed = p.policy->pack(x, p.info, {seed, stream});
  // A lossless policy (exact, swap), and a lossy one's copy of a shape it does not code, give the values
  // back themselves, signs included.
  if (keep_sign && !p.policy->is_lossless() && dynamic_cast<const PackedPassthrough*>(p.packed.get()) == nullptr) {
    p.sign = Tensor::empty({cpu::mask_words(x.numel())}, DType::I32);
    cpu::relu_mask_from_output(reinterpret_cast<uint32_t*>(p.sign.data<int32_t>()), x.data<float>(), x.numel());
  }
  return p;
}

// The PyPacked of a Python Packed. Packed.__new__ makes an instance whose C++ object was never constructed
// (pybind11 allocates it and marks the holder unconstructed): reading it would be reading garbage, so such
// an instance is a TypeError, as Packed() itself is.
const PyPacked& packed_of(const py::handle& self) {
  const auto vh = reinterpret_cast<py::detail::instance*>(self.ptr())->get_value_and_holder();
  if (!vh.holder_constructed())
    throw py::type_error("this Packed holds nothing: it was made by Packed.__new__, not by actlab.pack()");
  return *vh.value_ptr<PyPacked>();
}

// The policy's reconstruction as a new array. exact hands back the tensor it keeps, so that one is copied:
// a write to the returned array must not reach the pack (every other policy decodes into a fresh buffer).
py::array unpack(const py::object& packed, bool positive) {
  if (!py::isinstance<PyPacked>(packed)) throw py::type_error("unpack: an actlab.Packed from pack() is expected");
  const PyPacked& p = packed_of(packed);
  const Tensor out = p.policy->unpack(*p.packed, p.info);
  if (p.sign.defined())  // a lossy policy's decode is a fresh buffer of its own: corrected in place
    cpu::restore_sign(out.data<float>(), reinterpret_cast<const uint32_t*>(p.sign.data<int32_t>()), out.numel(),
                      positive);
  return array_of(p.policy->is_exact() ? out.clone() : out);
}

// A safetensors state dict (actlab-train --export-weights, or any writer) as {name: numpy array}, read and
// checked by io/safetensors (sizes, offsets, and the checksum when the file has one): for PyTorch users
// without the safetensors package (Debian has none), torch.from_numpy of each value is a state dict.
py::dict read_state_dict(const py::object& path_like) {
  // A str, bytes or any os.PathLike (pathlib.Path), as open() takes: os.fsencode gives the file system's bytes.
  const std::string path = py::bytes(py::module_::import("os").attr("fsencode")(path_like));
  const SafetensorsFile file = read_safetensors(path);
  py::dict out;
  for (const auto& [name, t] : file.tensors) {
    std::string format;
    switch (t.dtype()) {
      case DType::F32: format = py::format_descriptor<float>::format(); break;
      case DType::F16: format = "e"; break;
      case DType::I64: format = py::format_descriptor<int64_t>::format(); break;
      case DType::I32: format = py::format_descriptor<int32_t>::format(); break;
      case DType::U8: format = py::format_descriptor<uint8_t>::format(); break;
      default:
        throw py::type_error("read_state_dict: tensor '" + name + "' of '" + path + "' is " + dtype_name(t.dtype()) +
                             ", which NumPy has no type for");
    }
    std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
    py::array a(py::dtype(format), shape);  // its own copy: the file's tensors go when this returns
    if (t.nbytes() > 0) std::memcpy(a.mutable_data(), t.raw_data(), t.nbytes());
    out[py::str(name)] = a;
  }
  return out;
}

// train, forward and step_memory run one at a time: they seed the one initialisation generator and read
// the process-wide allocator figures, so two at once (Python threads; each releases the GIL) would change
// each other's weights and measurements. pack and unpack take no lock; made while a run measures, their
// bytes count in its figures.
std::mutex& run_mutex() {
  static std::mutex m;
  return m;
}

// train(key=value, ...): the keys of actlab-train's option table (with '_' for '-'); returns the summary.
py::object train_run(const py::kwargs& kwargs) {
  TrainConfig c;
  c.quiet = true;
  for (const auto& kv : kwargs) {
    std::string key = py::str(kv.first);
    for (char& ch : key) ch = ch == '_' ? '-' : ch;
    const py::handle v = kv.second;
    if (key == "policy-rule" && (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v))) {
      for (const auto& r : v) set_config_value(c, key, py::str(r));
    } else if (py::isinstance<py::bool_>(v)) {
      set_config_value(c, key, v.cast<bool>() ? "true" : "false");
    } else {
      set_config_value(c, key, py::str(v));
    }
  }
  TrainSummary s;
  {
    py::gil_scoped_release release;  // a run takes minutes; other Python threads go on
    std::lock_guard<std::mutex> lock(run_mutex());
    s = train(c);
  }
  return py::module_::import("json").attr("loads")(summary_to_json(s, c));
}

// forward(model, images, weights, classes): the named model's logits for a batch in evaluation mode, its
// weights from a plain safetensors state dict (torchvision/timm names, as --init-weights takes) or a fresh
// initialisation from seed. For checking actlab's models against another framework's with the same weights.
py::array forward(const std::string& model, const py::object& array, const std::string& weights, int64_t classes,
                  uint64_t seed) {
  const FloatArray images = float32_array(array, "forward");
  ACTLAB_CHECK(images.ndim() == 4, "forward: images must be (N, C, S, S), got ", images.ndim(), " dims");
  ACTLAB_CHECK(images.shape(2) == images.shape(3), "forward: images must be square (N, C, S, S), got ",
               images.shape(2), "x", images.shape(3));
  Tensor logits;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(run_mutex());
    const Tensor x = tensor_from(images);
    seed_init(seed);
    std::shared_ptr<Module> net = make_model({model, x.size(1), classes, x.size(2)});
    if (!weights.empty()) import_state_dict(read_safetensors(weights), *net, "weights '" + weights + "'");
    net->eval();
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
    std::lock_guard<std::mutex> lock(run_mutex());
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

  // The accessors take the Python object and go through packed_of, so that a Packed.__new__ instance is a
  // TypeError rather than a read of an object never constructed.
  py::class_<PyPacked>(m, "Packed", "An array as a policy keeps it until unpack().")
      .def_property_readonly("nbytes", [](const py::object& self) { return packed_of(self).nbytes(); },
                             "bytes held (the packed form)")
      .def_property_readonly("shape", [](const py::object& self) { return py::tuple(py::cast(packed_of(self).shape())); })
      .def_property_readonly("policy", [](const py::object& self) { return packed_of(self).policy->name(); })
      .def_property_readonly(
          "lossless",
          [](const py::object& self) {
            const PyPacked& p = packed_of(self);
            return p.policy->is_lossless() || dynamic_cast<const PackedPassthrough*>(p.packed.get()) != nullptr;
          },
          "True when unpack gives the array back bit for bit (exact, swap, or a shape the policy keeps as it is)")
      .def("__repr__", [](const py::object& self) {
        const PyPacked& p = packed_of(self);
        return "<actlab.Packed " + p.policy->name() + " " + shape_str(p.shape()) + ", " + std::to_string(p.nbytes()) +
               " bytes>";
      });
  m.def("pack", &pack, py::arg("array"), py::arg("policy") = "division:B=8,Q=2", py::arg("seed") = 0,
        py::arg("stream") = 0, py::arg("keep_sign") = false, py::arg("min_bits") = 0,
        "Packs a float32 array (N, C, H, W) or any shape with the policy (other dtypes are a TypeError): "
        "stochastic rounding draws from Philox(seed, stream), so the same arguments give the same bytes as "
        "actlab's C++ and CUDA codecs. keep_sign: also keep a 1-bit mask of x > 0 (counted in nbytes), and "
        "unpack gives 0 where it was clear (NaN stays NaN) and a positive value where it was set (what a ReLU "
        "output's backward reads). min_bits: the fewest code bits a Q-bit policy may use for this array "
        "(actlab's softmax probabilities take 8, since their backward's error counts relative to each "
        "probability); 0 leaves the policy's own width.");
  m.def("unpack", &unpack, py::arg("packed"), py::arg("positive") = true,
        "The float32 array the policy reconstructs, a new array each call (it owns actlab's buffer: no further copy). "
        "After pack(keep_sign=True), positive=True gives the mask's signs (0 where it was clear, a positive value "
        "where it was set: what a ReLU's backward tests); positive=False only its zeros, and the decoded values "
        "where it was set, negative ones included, which keeps them unbiased for a layer that multiplies by them.");
  m.def(
      "expected_bytes",
      [](const std::string& policy, const std::vector<int64_t>& shape) {
        // A negative extent or a shape past what the closed forms count is the policy's Error.
        return parse_policy(policy)->expected_bytes(Shape(shape.begin(), shape.end()));
      },
      py::arg("policy"), py::arg("shape"), "The closed-form bytes the policy keeps for a float32 tensor of this shape.");
  m.def("policy_forms", &policy_forms, "The accepted policy strings, one per line.");
  m.def("train", &train_run,
        "Runs actlab-train with these options (actlab-train --help lists them; '_' stands for '-') and returns "
        "the summary as a dict. quiet defaults to True. train, forward and step_memory run one at a time.");
  m.def("step_memory", &step_memory, py::arg("model") = "resnet20", py::arg("batch") = 128,
        py::arg("policy") = "division:B=8,Q=2", py::arg("image_size") = 32, py::arg("channels") = 3,
        py::arg("classes") = 10, py::arg("seed") = 0,
        "One training step's memory on random data, as actlab-memtable measures it (docs/measures.md).");
  m.def(
      "memory_stats", [] { return memory_stats().table(); }, "The allocator's table (MiB by tag) on the CPU.");
  m.def(
      "empty_cache", [] { empty_cache(Device::cpu()); },
      "Gives the CPU block pool's free blocks back to the system. Packs and unpacked arrays come from that pool, "
      "which keeps freed blocks for the next step of the same shapes; call this when a process is done with them.");
  m.def(
      "check_policy", [](const std::string& policy) { (void)policy_of(policy); }, py::arg("policy"),
      "Raises the error pack() would raise for this policy string, without packing anything.");
  m.def("read_state_dict", &read_state_dict, py::arg("path"),
        "A safetensors state dict (actlab-train --export-weights writes one) as {name: numpy array}, every size "
        "and offset checked; torch.from_numpy of each value gives PyTorch's state dict.");
  m.def("forward", &forward, py::arg("model"), py::arg("images"), py::arg("weights") = "", py::arg("classes") = 10,
        py::arg("seed") = 0,
        "The model's logits for images (N, C, S, S) float32 in evaluation mode, with the weights of a plain "
        "safetensors state dict (torchvision/timm names) or a fresh initialisation from seed.");
}
