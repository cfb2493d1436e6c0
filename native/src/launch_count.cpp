// count_launch / launch_count (launch_count.h).
#include "launch_count.h"

#include <atomic>

namespace openjet {
namespace {
std::atomic<long long> g_counts[static_cast<int>(Counted::kCount)];
}  // namespace

void count_launch(Counted what) { g_counts[static_cast<int>(what)].fetch_add(1, std::memory_order_relaxed); }
long long launch_count(Counted what) { return g_counts[static_cast<int>(what)].load(std::memory_order_relaxed); }

}  // namespace openjet
