#include "hyperpar/comm/contract.h"

#include <sstream>

#include "hyperpar/core/error.h"

namespace hyperpar::comm {

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  std::ostringstream os;
  os << "shape " << t.sizes() << " strides " << t.strides() << " dtype " << t.scalar_type()
     << " device " << t.device();
  return os.str();
}

void fail_contract(const CallSite& site, const std::string& problem) {
  std::ostringstream os;
  os << "hyperpar collective contract violated in " << site.op << " on " << site.group;
  if (!site.tag.empty()) os << " (tag '" << site.tag << "')";
  os << ": " << problem;
  throw ContractError(os.str());
}

void check_buffer(const CallSite& site, const char* role, const at::Tensor& t,
                  std::optional<c10::ScalarType> dtype, c10::DeviceType device) {
  if (!t.defined()) fail_contract(site, std::string(role) + " is an undefined tensor");
  // Described only on failure: this runs on every collective.
  const auto what = [&] { return std::string(role) + " (" + describe_tensor(t) + ")"; };
  if (t.is_meta())
    fail_contract(site, what() +
                            " is on the meta device: it has no data; materialise the "
                            "parameter (to_empty + init) before communicating");
  if (!t.is_contiguous())
    fail_contract(site, what() +
                            " is not contiguous: collectives need a flat contiguous "
                            "buffer; copy the view into one first");
  if (t.device().type() != device) {
    std::ostringstream os;
    os << what() << " is on device type " << t.device().type() << ", expected " << device;
    fail_contract(site, os.str());
  }
  if (dtype && t.scalar_type() != *dtype) {
    std::ostringstream os;
    os << what() << " has dtype " << t.scalar_type() << ", expected " << *dtype;
    fail_contract(site, os.str());
  }
}

void check_same_dtype(const CallSite& site, const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type()) {
    std::ostringstream os;
    os << "input dtype " << a.scalar_type() << " differs from output dtype " << b.scalar_type()
       << " (input " << describe_tensor(a) << ", output " << describe_tensor(b) << ")";
    fail_contract(site, os.str());
  }
}

void check_numel_ratio(const CallSite& site, const char* big_role, const at::Tensor& big,
                       const char* small_role, const at::Tensor& small, int64_t factor) {
  if (big.numel() != factor * small.numel()) {
    std::ostringstream os;
    os << big_role << " has " << big.numel() << " elements, expected group size " << factor << " x "
       << small_role << " " << small.numel() << " = " << factor * small.numel() << " (" << big_role
       << " " << describe_tensor(big) << ", " << small_role << " " << describe_tensor(small) << ")";
    fail_contract(site, os.str());
  }
}

}  // namespace hyperpar::comm
