// A host-side setting read from the environment at its first use, so that a launch path reads no environment after
// that, which tests and benchmarks may set instead (the test API's openjet_test_set_* entry points).
#pragma once

#include <atomic>

namespace openjet {

class EnvSetting {
public:
    // from_env: the value the environment gives (read once, at the first get() after construction or set(-1)).
    explicit constexpr EnvSetting(int (*from_env)()) : from_env_(from_env) {}

    int get() {
        int v = value_.load(std::memory_order_relaxed);
        if (v == kFromEnv) {
            value_.compare_exchange_strong(v, from_env_());
            v = value_.load(std::memory_order_relaxed);
        }
        return v;
    }
    // A value in [0, max] from now on; any other: the environment's again, read at the next get().
    void set(int mode, int max) { value_.store(mode >= 0 && mode <= max ? mode : kFromEnv); }

private:
    static constexpr int kFromEnv = -1;
    int (*from_env_)();
    std::atomic<int> value_{kFromEnv};
};

}  // namespace openjet
