// Test-only helpers for the wal/ GoogleTest suites: open + recover with expectations, and raw
// LMDB access to a closed WAL directory (independent counts, deliberate damage).
#pragma once

#include <gtest/gtest.h>
#include <lmdb.h>

#include <functional>
#include <memory>
#include <string>

#include "wal/wal.h"
#include "wal/wal_format.h"

namespace bitroll::wal::testing {

// Opens and recovers; nullptr (with a test failure) when either fails.
inline std::unique_ptr<Wal> OpenAndRecover(const WalOptions& o, RecoveryResult* rr = nullptr) {
  auto w = Wal::Open(o);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (!w.ok()) return nullptr;
  auto r = (*w)->Recover();
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (rr != nullptr && r.ok()) *rr = std::move(r).value();
  return std::move(w).value();
}

// Runs fn in one raw LMDB transaction on the environment in `dir` (no Wal may have it open):
// read-only, or read-write and committed after fn. `db(name)` opens a named database.
using RawDb = std::function<MDB_dbi(const char* name)>;
inline void WithRawTxn(const std::string& dir, bool write,
                       const std::function<void(MDB_txn*, const RawDb& db)>& fn) {
  MDB_env* env = nullptr;
  ASSERT_EQ(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, format::kMaxDbs);
  ASSERT_EQ(mdb_env_open(env, dir.c_str(), write ? 0 : MDB_RDONLY, 0644), 0);
  MDB_txn* txn = nullptr;
  ASSERT_EQ(mdb_txn_begin(env, nullptr, write ? 0 : MDB_RDONLY, &txn), 0);
  const RawDb db = [&](const char* name) {
    MDB_dbi dbi = 0;
    EXPECT_EQ(mdb_dbi_open(txn, name, 0, &dbi), 0) << name;
    return dbi;
  };
  fn(txn, db);
  if (write) {
    EXPECT_EQ(mdb_txn_commit(txn), 0);
  } else {
    mdb_txn_abort(txn);
  }
  mdb_env_close(env);
}

}  // namespace bitroll::wal::testing
