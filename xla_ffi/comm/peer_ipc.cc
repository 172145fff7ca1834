#include "xla_ffi/comm/peer_ipc.h"

#include <cstring>
#include <random>

namespace flashoverlap {
namespace {

constexpr char kMagic[8] = {'F', 'O', 'P', 'E', 'E', 'R', '0', '1'};  // ..01: the version

// One random number per process: tells records made here from others' (process ids repeat
// across PID namespaces on one host).
uint64_t ProcessNonce() {
  static const uint64_t nonce = [] {
    std::random_device device;
    return (uint64_t{device()} << 32) ^ device() ^ 1;  // never 0
  }();
  return nonce;
}

template <class T>
void Put(std::string* out, const T& value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <class T>
void Take(const char** in, T* value) {
  std::memcpy(value, *in, sizeof(T));
  *in += sizeof(T);
}

}  // namespace

Status MakePeerRecord(int device, const void* recv, size_t recv_bytes, const int32_t* signals,
                      uint64_t generation, std::string* bytes) {
  PeerRecord r;
  r.recv_bytes = recv_bytes;
  r.generation = generation;
  r.process_nonce = ProcessNonce();
  cudaDeviceProp prop;
  FO_RETURN_IF_CUDA(cudaGetDeviceProperties(&prop, device));
  static_assert(sizeof(prop.uuid) == sizeof(r.device_uuid), "a CUDA UUID is 16 bytes");
  std::memcpy(r.device_uuid, &prop.uuid, sizeof(r.device_uuid));
  FO_RETURN_IF_CUDA(cudaIpcGetMemHandle(&r.recv, const_cast<void*>(recv)));
  FO_RETURN_IF_CUDA(cudaIpcGetMemHandle(&r.signals, const_cast<int32_t*>(signals)));
  bytes->clear();
  bytes->append(kMagic, sizeof(kMagic));
  Put(bytes, r.recv_bytes);
  Put(bytes, r.generation);
  Put(bytes, r.process_nonce);
  bytes->append(reinterpret_cast<const char*>(r.device_uuid), sizeof(r.device_uuid));
  Put(bytes, r.recv);
  Put(bytes, r.signals);
  return Status::Ok();
}

Status ParsePeerRecord(const std::string& bytes, PeerRecord* record) {
  if (bytes.size() != kPeerRecordBytes) {
    return Status::Error("a peer-store record has " + std::to_string(kPeerRecordBytes) +
                         " bytes, got " + std::to_string(bytes.size()));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return Status::Error("not a peer-store record of this jax_flashoverlap version (its first "
                         "8 bytes differ): every process must run the same version");
  }
  const char* in = bytes.data() + sizeof(kMagic);
  PeerRecord r;
  Take(&in, &r.recv_bytes);
  Take(&in, &r.generation);
  Take(&in, &r.process_nonce);
  std::memcpy(r.device_uuid, in, sizeof(r.device_uuid));
  in += sizeof(r.device_uuid);
  Take(&in, &r.recv);
  Take(&in, &r.signals);
  if (r.generation == 0 || r.recv_bytes == 0) {
    return Status::Error("a peer-store record without a recv buffer (generation " +
                         std::to_string(r.generation) + ", " + std::to_string(r.recv_bytes) +
                         " bytes)");
  }
  *record = r;
  return Status::Ok();
}

bool MadeHere(const PeerRecord& record) { return record.process_nonce == ProcessNonce(); }

std::string UuidText(const uint8_t uuid[16]) {
  static const char* kHex = "0123456789abcdef";
  std::string text = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    text += kHex[uuid[i] >> 4];
    text += kHex[uuid[i] & 15];
  }
  return text;
}

Status OpenPeerRecord(const PeerRecord& record, int rank, PeerMappings* m) {
  if (rank < 0 || rank >= kMaxPeerRanks) return Status::Error("rank out of range");
  if (MadeHere(record)) {
    return Status::Error("rank " + std::to_string(rank) + "'s peer-store record was made by "
                         "this process: a group spanning processes takes peer stores with one "
                         "GPU per process");
  }
  if (m->generation[rank] == record.generation) return Status::Ok();
  if (m->recv[rank] != nullptr) {
    FO_RETURN_IF_CUDA(cudaIpcCloseMemHandle(m->recv[rank]));
    m->recv[rank] = nullptr;
    m->generation[rank] = 0;
  }
  if (m->signals[rank] == nullptr) {
    void* signals = nullptr;
    FO_RETURN_IF_CUDA(cudaIpcOpenMemHandle(&signals, record.signals, cudaIpcMemLazyEnablePeerAccess));
    m->signals[rank] = static_cast<int32_t*>(signals);
  }
  FO_RETURN_IF_CUDA(cudaIpcOpenMemHandle(&m->recv[rank], record.recv, cudaIpcMemLazyEnablePeerAccess));
  m->generation[rank] = record.generation;
  return Status::Ok();
}

Status ClosePeerMappings(PeerMappings* m, bool keep_signals) {
  Status first = Status::Ok();
  auto close = [&first](void*& p, const char* what) {
    if (p == nullptr) return;
    Status s = CudaStatus(cudaIpcCloseMemHandle(p), what);
    if (first.ok()) first = s;
    p = nullptr;
  };
  for (int i = 0; i < kMaxPeerRanks; ++i) {
    close(m->recv[i], "cudaIpcCloseMemHandle (a peer's recv)");
    m->generation[i] = 0;
    if (!keep_signals) {
      void* signals = m->signals[i];
      close(signals, "cudaIpcCloseMemHandle (a peer's signal words)");
      m->signals[i] = nullptr;
    }
  }
  return first;
}

}  // namespace flashoverlap
