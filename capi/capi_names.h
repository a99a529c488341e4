// The kvharbor::capi helpers and SDK names that the C ABI's exported
// definitions use. Those definitions sit at global scope inside extern "C"
// (as capi/kvharbor_c.h declares them), so the names are brought there, once,
// instead of by a using block in each translation unit. Internal to
// libkvharbor_c: include it only from capi/*.cc.
// Declarations only: no memory, no state.
#ifndef KVHARBOR_CAPI_CAPI_NAMES_H_
#define KVHARBOR_CAPI_CAPI_NAMES_H_

#include "capi/capi_util.h"
#include "kvharbor/client.h"

using kvharbor::CallOptions;
using kvharbor::capi::CheckCall;
using kvharbor::capi::CheckClient;
using kvharbor::capi::CheckTimeout;
using kvharbor::capi::CheckTokens;
using kvharbor::capi::DefaultTimeout;
using kvharbor::capi::Guard;
using kvharbor::capi::NotNull;
using kvharbor::capi::ReturnFetch;
using kvharbor::capi::ReturnInsert;
using kvharbor::capi::ReturnJson;
using kvharbor::capi::ReturnString;
namespace client = kvharbor::client;

#endif  // KVHARBOR_CAPI_CAPI_NAMES_H_
