// LocalCommunicator (dist/communicator.h): the one-rank identity.
#include "actlab/dist/communicator.h"

namespace actlab {
namespace {
class DoneWork : public CollectiveWork {
 public:
  void wait() override {}
  double seconds() const override { return 0; }
};
}  // namespace

std::unique_ptr<CollectiveWork> LocalCommunicator::allreduce_sum_async(Tensor t) {
  ACTLAB_CHECK(t.dtype() == DType::F32 && t.is_contiguous(), "allreduce needs a contiguous f32 tensor, got ", t.str());
  return std::make_unique<DoneWork>();
}

}  // namespace actlab
