/* kvharbor_c.h: the stable C ABI of the kvharbor client SDK (libkvharbor_c).
 *
 * A thin extern "C" layer over kvharbor::Client (include/kvharbor/client.h) for
 * languages that can call C but not C++: Python through ctypes
 * (python/kvharbor), and anything else with a C FFI. Only plain C types cross
 * this boundary: no C++ object, exception or allocator does. The library
 * exports nothing but the kvh_* symbols.
 *
 * Errors: every function that can fail returns an int status code, 0 (KVH_OK)
 * on success, otherwise the gRPC / absl::StatusCode number (KVH_NOT_FOUND,
 * KVH_INVALID_ARGUMENT, ...). The message of the last failure on the calling
 * thread is kvh_last_error_message(); bad input is reported there with the
 * name of the field. No function aborts on bad input, and none throws. Out
 * parameters are written only on success.
 *
 * Memory: a kvh_client is created by kvh_connect and destroyed by kvh_close.
 * Page memory always belongs to the caller: insert only reads the pages
 * during the call (no copy is made on the caller's side), fetch writes only
 * inside the buffer it was given (and may leave it partly written on
 * failure). Strings returned through `char**` out parameters are allocated by
 * the library and must be freed with kvh_string_free.
 *
 * Thread safety: a kvh_client may be used from any number of threads at once
 * (the SDK is thread-safe); kvh_close must not race with other calls on the
 * same client. The error message is thread-local.
 *
 * Deadlines: `timeout_ms` of a call is its deadline in milliseconds; 0 uses
 * the client's default (given to kvh_connect); negative is INVALID_ARGUMENT.
 *
 * ABI: functions and structs are only ever added; KVH_ABI_VERSION rises when
 * they are. kvh_abi_version() says what the loaded library provides.
 */
#ifndef KVHARBOR_CAPI_KVHARBOR_C_H_
#define KVHARBOR_CAPI_KVHARBOR_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVH_API __attribute__((visibility("default")))
#else
#define KVH_API
#endif

/* 1: the first ABI. 2: kvh_namespace_spec and kvh_namespace_create_spec
 * (codec calibration, tiers), kvh_match_tiers, kvh_demote,
 * kvh_get_calibration; tier fields in the namespace and stats JSON.
 * 3: kvh_connect_options and kvh_connect_with (TLS, mutual TLS, bearer
 * token). 4: engine KV-cache layouts (kvh_kv_layout, kvh_fetch_to_layout,
 * kvh_insert_from_layout, kvh_gpu_transfers) and the path options
 * host_fetch, device_ipc, gpu_decode of kvh_connect_options.
 * 5: the KVCM path and online calibration in kvh_namespace_spec;
 * kvh_upload_calibration, kvh_list_calibrations, kvh_pin_calibration,
 * kvh_get_calibration_fp; kvh_fetch_compressed / kvh_decode_page (codec
 * buffers undecoded), kvh_fetch_transformed (KVCM); kvh_get_host_handles,
 * kvh_get_device_handles, kvh_get_host_fetch_stats; the cluster client
 * (kvh_cluster_*); calibration and KVCM keys in the namespace and stats
 * JSON; own_connection, max_reconnect_backoff_ms, fetch_chunk_bytes,
 * insert_chunk_bytes and no_checksums of kvh_connect_options; and the engine
 * API (docs/engines_api.md): page-key namespaces (kvh_namespace_spec.
 * key_kind, kvh_sequence, kvh_match_seq), appends (kvh_insert_options,
 * kvh_insert_seq, kvh_insert_seq_pages), layer-range fetches
 * (kvh_fetch_layers, kvh_fetch_pages_layers) and layer-by-layer uploads
 * (kvh_upload_*); "key_kind" in the namespace JSON; per-codec stats
 * ("codecs") and the calibration's state and expectation ("calibration") in
 * the stats JSON.
 * 6: inserts from GPU layouts into the daemon's device tier by CUDA IPC
 * (kvh_layout_insert_options, kvh_insert_from_layout_with; the path is
 * "device_ipc" in the result JSON); stage_cold and gpu_decode_gemm of
 * kvh_connect_options.
 * 7: the bulk data plane option of kvh_connect_options.
 * 8: KVH_KEY_PAGE_HASHES (each page found by its own chained-hash key) and
 * the topology of kvh_namespace_spec (kvh_topology: model, layer and KV-head
 * ranges); "topology" in the namespace JSON. */
#define KVH_ABI_VERSION 8

/* Status codes: the numbers of grpc::StatusCode and absl::StatusCode. */
enum {
  KVH_OK = 0,
  KVH_CANCELLED = 1,
  KVH_UNKNOWN = 2,
  KVH_INVALID_ARGUMENT = 3,
  KVH_DEADLINE_EXCEEDED = 4,
  KVH_NOT_FOUND = 5,
  KVH_ALREADY_EXISTS = 6,
  KVH_PERMISSION_DENIED = 7,
  KVH_RESOURCE_EXHAUSTED = 8,
  KVH_FAILED_PRECONDITION = 9,
  KVH_ABORTED = 10,
  KVH_OUT_OF_RANGE = 11,
  KVH_UNIMPLEMENTED = 12,
  KVH_INTERNAL = 13,
  KVH_UNAVAILABLE = 14,
  KVH_DATA_LOSS = 15,
  KVH_UNAUTHENTICATED = 16
};

/* Element types (kvharbor.v1.DType) and page layouts (kvharbor.v1.PageLayout).
 */
enum {
  KVH_DTYPE_BF16 = 1,
  KVH_DTYPE_FP16 = 2,
  KVH_DTYPE_FP32 = 3,
  KVH_DTYPE_FP8_E4M3 = 4
};
enum {
  KVH_LAYOUT_KV_LAYER_TOKEN_HEAD_DIM = 1, /* [2][layer][token][head][dim] */
  KVH_LAYOUT_LAYER_KV_TOKEN_HEAD_DIM = 2  /* [layer][2][token][head][dim] */
};

/* Fetch formats. RAW: the daemon sends raw page bytes. COMPRESSED: it sends
 * the stored codec buffers and the SDK decodes them on the CPU (it gets the
 * calibration once); the caller receives raw pages either way (KVTC within
 * the codec's bounds). */
enum { KVH_FETCH_RAW = 0, KVH_FETCH_COMPRESSED = 1 };

/* Fetch transforms (kvharbor.v1.FetchTransform; kvh_fetch_transformed). KVCM
 * is LOSSY and LENGTH-CHANGING: the namespace's KVCM compressor merges
 * tokens, so the result is a new, shorter KV sequence, not the pages. */
enum { KVH_TRANSFORM_NONE = 0, KVH_TRANSFORM_KVCM = 1 };

/* Online calibration (ABI 5): KVTC row kinds and the RoPE style of keys. */
enum { KVH_KVTC_ROWS_PER_TOKEN = 0, KVH_KVTC_ROWS_PER_PAGE = 1 };
enum {
  KVH_ROPE_NONE = 0,
  KVH_ROPE_INTERLEAVED = 1, /* pairs (2i, 2i+1) */
  KVH_ROPE_HALF_SPLIT = 2   /* pairs (i, i + head_dim/2) */
};

/* Page tiers (kvharbor.v1.Tier), hottest first (docs/tiers.md). */
enum {
  KVH_TIER_RAW = 0,             /* raw bytes in the namespace's page pool */
  KVH_TIER_HOST_COMPRESSED = 1, /* a codec buffer in the daemon's memory */
  KVH_TIER_DISK = 2             /* a codec buffer in a file of disk_dir */
};

typedef struct kvh_client kvh_client;

typedef struct kvh_geometry {
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t page_size; /* tokens per page */
  int32_t dtype;      /* KVH_DTYPE_* */
  int32_t layout;     /* KVH_LAYOUT_*; 0 = the daemon's default */
  float rope_theta;   /* 0 = none */
} kvh_geometry;

/* Online calibration of a kvtc namespace (ABI 5; kvharbor.v1.
 * OnlineCalibration, docs/calibration.md). Zero-initialized = off. */
typedef struct kvh_online_calibration {
  int enabled;                /* nonzero: the fields below apply */
  uint64_t min_tokens;        /* inserted tokens before calibrating; 0 = the
                                 daemon's default (65536) */
  uint64_t max_sample_tokens; /* sample size; 0 = the default (16384) */
  double target_ratio;        /* compression aimed at; 0 = the default (16) */
  int32_t row_kind;           /* KVH_KVTC_ROWS_* */
  int32_t rope_style;         /* KVH_ROPE_*: undone on keys first */
  int64_t sink_tokens;        /* positions kept in FP8; -1 = the default (4) */
} kvh_online_calibration;

/* Which part of which model a namespace's pages hold (ABI 8;
 * kvharbor.v1.Topology, docs/engines_api.md "Topology"). Zero-initialized =
 * the whole model. A second create (if_not_exists) of the same name with
 * another topology, geometry or key kind is KVH_ALREADY_EXISTS naming the
 * first differing field (spec.topology.layer_begin, spec.geometry.dtype,
 * ...). */
typedef struct kvh_topology {
  const char* model;       /* the engine's model id; NULL or "" = not given */
  uint32_t total_layers;   /* layers of the model; 0 = layer_end */
  uint32_t layer_begin;    /* model layers [layer_begin, layer_end) held */
  uint32_t layer_end;      /* 0 = layer_begin + geometry.num_layers */
  uint32_t total_kv_heads; /* KV heads of the model; 0 = kv_head_end */
  uint32_t kv_head_begin;  /* KV heads [kv_head_begin, kv_head_end) held */
  uint32_t kv_head_end;    /* 0 = kv_head_begin + geometry.num_kv_heads */
} kvh_topology;

/* Everything a namespace is created with (ABI 2; client::NamespaceSpec).
 * The caller sets `struct_size` to sizeof(kvh_namespace_spec) of the header it
 * was compiled with: fields are only ever appended, so the library reads the
 * fields that size covers (ABI 2: up to disk_bytes; ABI 5: up to key_kind;
 * ABI 8: all), and refuses
 * (INVALID_ARGUMENT naming "spec.struct_size") a size it does not know. Strings
 * may be NULL (= ""). The library only reads the struct and what it points to
 * during the call. */
typedef struct kvh_namespace_spec {
  size_t struct_size;
  const char* name;
  kvh_geometry geometry;
  uint64_t capacity_bytes; /* 0 = the daemon's default share */
  const char* codec;       /* "" = identity; "kvtc", "int8_c8", "commvq" */
  /* A calibrated codec's calibration: a path on the daemon's machine, or the
   * canonical bytes inline (what kvh_get_calibration returns); one of the
   * two. */
  const char* calibration_path;
  const void* calibration;
  size_t calibration_len;
  /* Tiers: host-compressed budget (0 = no cold tiers), a disk directory on the
   * daemon's machine ("" = none) and its budget (0 = unlimited). */
  uint64_t host_compressed_bytes;
  const char* disk_dir;
  uint64_t disk_bytes;
  /* ABI 5. A KVCM .bin file on the daemon's machine ("" = none): enables
   * kvh_fetch_transformed with KVH_TRANSFORM_KVCM. */
  const char* kvcm_path;
  /* ABI 5. Online calibration (codec "kvtc" only; docs/calibration.md). */
  kvh_online_calibration online_calibration;
  /* ABI 5. KVH_KEY_TOKENS (0: keyed by token ids), KVH_KEY_PAGE_KEYS (one
   * opaque key of 1..32 bytes per page; docs/engines_api.md) or (ABI 8)
   * KVH_KEY_PAGE_HASHES (the same keys, each a chained hash that finds its
   * page alone). */
  int32_t key_kind;
  /* ABI 8. The model, pipeline stage and tensor-parallel rank of the
   * pages. */
  kvh_topology topology;
} kvh_namespace_spec;

/* A namespace's codec and calibration (kvh_get_calibration). `codec` and
 * `bytes` are allocated by the library and freed with kvh_calibration_free. */
typedef struct kvh_calibration {
  char* codec;
  uint8_t* bytes; /* canonical calibration bytes; NULL when there are none */
  size_t num_bytes;
  uint64_t fingerprint; /* 0 = none */
} kvh_calibration;

typedef struct kvh_match_result {
  uint64_t lease_id; /* 0 without lock or when nothing matched */
  int64_t lease_expires_unix_ms;
  uint64_t matched_tokens; /* a multiple of page_size */
  uint64_t page_bytes;
  uint64_t num_pages; /* handles written */
} kvh_match_result;

typedef struct kvh_insert_result {
  uint64_t already_present_tokens;
  uint32_t pages_stored;
  uint32_t pages_evicted;
} kvh_insert_result;

/* Which pages a fetch asks for: a lease's pages [start_page, start_page +
 * page_count) (page_count 0 = to the end), or `num_handles` handles. */
typedef struct kvh_fetch_source {
  uint64_t lease_id;
  uint32_t start_page;
  uint32_t page_count;
  const uint64_t* handles;
  size_t num_handles;
} kvh_fetch_source;

typedef struct kvh_fetch_result {
  uint32_t num_pages;
  uint64_t page_bytes;
  uint64_t bytes_written;
} kvh_fetch_result;

typedef struct kvh_evict_result {
  uint64_t pages_evicted;
  uint64_t bytes_freed;
} kvh_evict_result;

/* ---- Library ---- */
KVH_API const char* kvh_version(void); /* "MAJOR.MINOR.PATCH", static */
KVH_API int kvh_abi_version(void);
/* Code and message of the last failed call on this thread (KVH_OK and "" if
 * none failed yet). The pointer stays valid until the next kvh_ call on this
 * thread. */
KVH_API int kvh_last_error_code(void);
KVH_API const char* kvh_last_error_message(void);
KVH_API void kvh_string_free(char* s);

/* ---- Connection ---- */
/* Creates a client for `address` (HOST:PORT) with a default call deadline
 * (0 = none). Does not connect: the first call does. Clients of this library
 * take messages of up to 1 GiB (a KVTC calibration arrives in one). */
KVH_API int kvh_connect(const char* address, int64_t default_timeout_ms,
                        kvh_client** out);
/* How kvh_connect_with connects (ABI 3; the security fields of
 * kvharbor::ClientOptions, docs/operations.md "Security"; ABI 4 appends the
 * path options, ABI 5 the connection and transfer fields). Zero-initialize, set
 * `struct_size` to sizeof(kvh_connect_options) of the header compiled with (a
 * size the library does not know is INVALID_ARGUMENT naming
 * "options.struct_size"), then what is needed; NULL strings are unset. TLS is
 * on when `tls` is nonzero or any tls_* file is given; the files are read by
 * the call. The token is copied; it never appears in an error message. */
typedef struct kvh_connect_options {
  size_t struct_size;
  int64_t default_timeout_ms;  /* 0 = no default call deadline */
  int tls;                     /* nonzero: TLS with the system's roots */
  const char* tls_ca_file;     /* PEM roots verifying the daemon */
  const char* tls_cert_file;   /* client certificate (mutual TLS) */
  const char* tls_key_file;    /* its private key */
  const char* tls_server_name; /* name checked in the daemon's certificate */
  const char* token;           /* bearer token sent with every call */
  /* ABI 4 (read when struct_size covers them; 0 = auto everywhere).
   * host_fetch: same-host Fetch through the daemon's shared memory
   * (KVH_MODE_AUTO: when the address is on this host). device_ipc: fetches
   * into GPU layouts map the daemon's device arena with CUDA IPC (same
   * modes). gpu_decode: cold pages of fetches into GPU layouts come
   * COMPRESSED and are decoded on this GPU (AUTO/ON) or come RAW (OFF). */
  int host_fetch;
  int device_ipc;
  int gpu_decode;
  /* ABI 5. Nonzero: a connection of this client's own, not shared with
   * other clients of the same address (so it does not inherit their
   * reconnect backoff). */
  int own_connection;
  /* ABI 5. Longest pause between reconnect attempts to a daemon that went
   * away, in ms; 0 = gRPC's default (up to 120 s). An engine that must see
   * a restarted daemon at once sets about 1000. */
  int64_t max_reconnect_backoff_ms;
  /* ABI 5. FetchRequest.max_chunk_bytes (0 = the daemon's default, 1 MiB;
   * else 1024 up to the daemon's maximum). */
  uint32_t fetch_chunk_bytes;
  /* ABI 5. Page bytes per Insert message; 0 = the SDK's default (1 MiB). */
  uint32_t insert_chunk_bytes;
  /* ABI 5. Nonzero: send no InsertHeader.page_checksums (the daemon then
   * cannot check what arrived) and verify no fetched page's checksum. The
   * default (0) sends and verifies them. */
  int no_checksums;
  /* ABI 6. Nonzero: fetches into GPU layouts through device_ipc ask the
   * daemon to decode the lease's cold pages on its GPU into its device tier
   * first (ClientOptions::stage_cold; falls back when it has no room). */
  int stage_cold;
  /* ABI 6. The reconstruction GEMM of cold pages decoded on this GPU:
   * KVH_GEMM_DEFAULT (TF32), KVH_GEMM_FP32, KVH_GEMM_TF32, KVH_GEMM_BF16. */
  int gpu_decode_gemm;
  /* ABI 7. The bulk data plane (ClientOptions::data_plane,
   * docs/data_plane.md): RAW fetches whose page bytes come on TCP
   * connections beside gRPC. KVH_MODE_AUTO: when the channel has no TLS;
   * KVH_MODE_ON: with TLS too; KVH_MODE_OFF: never. data_plane_connections:
   * the connections one fetch opens on it (0 = 4; else 1 to 16). */
  int data_plane;
  uint32_t data_plane_connections;
} kvh_connect_options;
enum { KVH_MODE_AUTO = 0, KVH_MODE_ON = 1, KVH_MODE_OFF = 2 };
enum {
  KVH_GEMM_DEFAULT = 0,
  KVH_GEMM_FP32 = 1,
  KVH_GEMM_TF32 = 2,
  KVH_GEMM_BF16 = 3
};
/* kvh_connect with security options (ABI 3). `options` may be NULL (= all
 * unset, as kvh_connect with no deadline); struct_size is the ABI 7 size,
 * the ABI 6 one (up to gpu_decode_gemm), the ABI 5 one (up to no_checksums),
 * the ABI 4 one (up to gpu_decode) or the ABI 3 one (up to token). */
KVH_API int kvh_connect_with(const char* address,
                             const kvh_connect_options* options,
                             kvh_client** out);
/* Waits until the channel is connected (DEADLINE_EXCEEDED otherwise). */
KVH_API int kvh_wait_connected(kvh_client* client, int64_t timeout_ms);
/* Destroys the client; NULL is ignored. */
KVH_API void kvh_close(kvh_client* client);

/* ---- Namespaces ----
 * Namespace descriptions are JSON objects: {"name", "geometry": {...},
 * "capacity_bytes", "codec", "calibration_fingerprint",
 * "host_compressed_bytes", "disk_dir", "disk_bytes", "stats": {...}}; a list
 * is a JSON array. The calibration itself is never in them. */
/* The ABI 1 form: no calibration, no tiers. */
KVH_API int kvh_namespace_create(kvh_client* client, const char* name,
                                 const kvh_geometry* geometry,
                                 uint64_t capacity_bytes, const char* codec,
                                 int if_not_exists, int64_t timeout_ms,
                                 int* created, char** info_json);
/* Any namespace (ABI 2); see kvh_namespace_spec. */
KVH_API int kvh_namespace_create_spec(kvh_client* client,
                                      const kvh_namespace_spec* spec,
                                      int if_not_exists, int64_t timeout_ms,
                                      int* created, char** info_json);
KVH_API int kvh_namespace_describe(kvh_client* client, const char* name,
                                   int64_t timeout_ms, char** info_json);
KVH_API int kvh_namespace_list(kvh_client* client, int64_t timeout_ms,
                               char** list_json);
KVH_API int kvh_namespace_delete(kvh_client* client, const char* name,
                                 int force, int64_t timeout_ms);

/* ---- Match and leases ----
 * Writes one handle per matched page into `handles`; `handles_capacity` must
 * hold them all (num_tokens always suffices), else OUT_OF_RANGE naming
 * "handles_capacity" (and a lease taken is released again). */
KVH_API int kvh_match(kvh_client* client, const char* ns, const int32_t* tokens,
                      size_t num_tokens, int lock, int64_t lease_ttl_ms,
                      uint64_t* handles, size_t handles_capacity,
                      kvh_match_result* out, int64_t timeout_ms);
/* Same, also writing each matched page's tier (KVH_TIER_*, at match time)
 * into `page_tiers` when it is not NULL; it holds `handles_capacity` entries
 * like `handles` (ABI 2). */
KVH_API int kvh_match_tiers(kvh_client* client, const char* ns,
                            const int32_t* tokens, size_t num_tokens, int lock,
                            int64_t lease_ttl_ms, uint64_t* handles,
                            int32_t* page_tiers, size_t handles_capacity,
                            kvh_match_result* out, int64_t timeout_ms);
KVH_API int kvh_release(kvh_client* client, uint64_t lease_id,
                        int64_t timeout_ms);
KVH_API int kvh_extend_lease(kvh_client* client, uint64_t lease_id,
                             int64_t lease_ttl_ms,
                             int64_t* lease_expires_unix_ms,
                             int64_t timeout_ms);

/* ---- Insert ----
 * `pages` holds the pages of `tokens` back to back (pages_len bytes, a
 * multiple of page_bytes); page_bytes 0 = look it up from the namespace. */
KVH_API int kvh_insert(kvh_client* client, const char* ns,
                       const int32_t* tokens, size_t num_tokens,
                       const void* pages, size_t pages_len, uint64_t page_bytes,
                       kvh_insert_result* out, int64_t timeout_ms);
/* Same, one pointer per page, each `page_bytes` long, wherever they live. */
KVH_API int kvh_insert_pages(kvh_client* client, const char* ns,
                             const int32_t* tokens, size_t num_tokens,
                             const void* const* pages, size_t num_pages,
                             uint64_t page_bytes, kvh_insert_result* out,
                             int64_t timeout_ms);

/* ---- Fetch ----
 * Writes page i at dst + i * page_bytes; dst_capacity must hold every page
 * (INVALID_ARGUMENT naming "dst" otherwise). Checksums are verified by the
 * SDK (DATA_LOSS on a mismatch). `format` is KVH_FETCH_*. */
KVH_API int kvh_fetch(kvh_client* client, const char* ns,
                      const kvh_fetch_source* source, int format, void* dst,
                      size_t dst_capacity, kvh_fetch_result* out,
                      int64_t timeout_ms);
/* Same, page i at page_dsts[i] (num_dsts pointers, page_capacity bytes each).
 */
KVH_API int kvh_fetch_pages(kvh_client* client, const char* ns,
                            const kvh_fetch_source* source, int format,
                            void* const* page_dsts, size_t num_dsts,
                            uint64_t page_capacity, kvh_fetch_result* out,
                            int64_t timeout_ms);

/* ---- Engine KV-cache layouts (ABI 4; docs/hit_paths.md) ----
 * An engine's paged KV cache: per layer the address of its K and V caches;
 * element (block b, token t, head h, d) of a layer's K cache is at
 * k[layer] + (b * block_stride + t * token_stride + h * head_stride + d) *
 * element size (strides in ELEMENTS, head_dim contiguous). One block holds
 * a namespace page's tokens (block_size == page_size). The layers are
 * namespace layers [layer_begin, layer_begin + num_layers). `device` is the
 * CUDA ordinal of the memory, or KVH_HOST_DEVICE. Set struct_size to
 * sizeof(kvh_kv_layout). The library reads the struct and the arrays during
 * the call only. */
enum { KVH_HOST_DEVICE = -1 };
typedef struct kvh_kv_layout {
  size_t struct_size;
  int32_t dtype;  /* KVH_DTYPE_*; must be the namespace's */
  int32_t device; /* CUDA ordinal, or KVH_HOST_DEVICE */
  uint32_t layer_begin;
  uint32_t num_layers; /* entries of k, v (and k_bytes, v_bytes) */
  const uint64_t* k;
  const uint64_t* v;
  /* NULL, or per layer the bytes of the caller's buffer from k[i] / v[i]
   * (0 = unknown): every element addressed must lie inside. */
  const uint64_t* k_bytes;
  const uint64_t* v_bytes;
  uint32_t num_kv_heads; /* 0 = the namespace's */
  uint32_t head_dim;     /* 0 = the namespace's */
  uint32_t block_size;   /* 0 = the namespace's page_size */
  uint64_t num_blocks;
  int64_t block_stride; /* elements, all >= 1 */
  int64_t token_stride;
  int64_t head_stride;
} kvh_kv_layout;
/* Whether this library moves pages into and out of GPU layouts (built with
 * CUDA): 1, else 0 (GPU layouts are then UNIMPLEMENTED). */
KVH_API int kvh_gpu_transfers(void);
/* Fetches lease pages [start_page, start_page + num_pages) into blocks
 * block_ids[0..num_pages) of `layout`, by the fastest path (device IPC,
 * shared host memory, the RAW or COMPRESSED gRPC stream; host layouts: the
 * CPU), returning once the layout holds them. `page_tiers` (may be NULL):
 * the lease's tiers from its page 0 (kvh_match_tiers), which pick the path
 * of cold pages. `format`: -1 = automatic, or KVH_FETCH_RAW /
 * KVH_FETCH_COMPRESSED to force that gRPC stream. `cuda_stream`: a
 * cudaStream_t whose earlier work the fetch waits for (0 = none).
 * `result_json` (may be NULL): {"path", "pages", "bytes_moved", "h2d_bytes",
 * "seconds", "stages": {name: seconds}, "fallbacks": [...]}. Bad input is
 * INVALID_ARGUMENT naming the field (layout.*, block_ids[i]) and writes
 * nothing; a GPU layout without CUDA is UNIMPLEMENTED. */
KVH_API int kvh_fetch_to_layout(
    kvh_client* client, const char* ns, uint64_t lease_id, uint32_t start_page,
    const int32_t* page_tiers, size_t num_page_tiers,
    const kvh_kv_layout* layout, const int64_t* block_ids, size_t num_pages,
    int format, uint64_t cuda_stream, int64_t timeout_ms, char** result_json);
/* Stores the pages of `tokens` (a whole number of pages), page i gathered
 * from blocks block_ids[i] of `layout` (all the namespace's layers):
 * kvh_insert_from_layout_with with device_ipc KVH_MODE_AUTO. */
KVH_API int kvh_insert_from_layout(kvh_client* client, const char* ns,
                                   const int32_t* tokens, size_t num_tokens,
                                   const kvh_kv_layout* layout,
                                   const int64_t* block_ids, size_t num_pages,
                                   uint64_t cuda_stream, kvh_insert_result* out,
                                   int64_t timeout_ms, char** result_json);
/* How kvh_insert_from_layout_with stores pages of a GPU layout (ABI 6).
 * Zero-initialize, set struct_size to sizeof(kvh_layout_insert_options). */
typedef struct kvh_layout_insert_options {
  size_t struct_size;
  /* A cudaStream_t whose earlier work the gather waits for (0 = none). */
  uint64_t cuda_stream;
  /* "device_ipc": DeviceInsert into the daemon's device tier, the pages
   * gathered straight into its slots through CUDA IPC. KVH_MODE_AUTO: when
   * the client's device_ipc (kvh_connect_options) allows it, falling back
   * to "host_shm" (a same-host daemon with host pools reads the pages out
   * of this process's staging region) or "pinned" staging + the Insert
   * stream when the daemon cannot take it (no device tier, IPC not allowed,
   * another host; the result's "fallbacks" say why). KVH_MODE_ON:
   * device_ipc or FAILED_PRECONDITION naming "device_ipc". KVH_MODE_OFF:
   * "host_shm" or "pinned". A
   * host layout with KVH_MODE_ON is INVALID_ARGUMENT naming "device_ipc". */
  int device_ipc;
  /* How long the daemon holds the reserved device slots before the
   * commit, in ms (0 = its default lease TTL). */
  uint32_t ttl_ms;
} kvh_layout_insert_options;
/* kvh_insert_from_layout with `options` (NULL = all defaults). The result
 * JSON's "path" is "device_ipc", "host_shm", "pinned" or "cpu" (host
 * layouts). */
KVH_API int kvh_insert_from_layout_with(
    kvh_client* client, const char* ns, const int32_t* tokens,
    size_t num_tokens, const kvh_kv_layout* layout, const int64_t* block_ids,
    size_t num_pages, const kvh_layout_insert_options* options,
    kvh_insert_result* out, int64_t timeout_ms, char** result_json);
/* ---- Compressed pages and transforms (ABI 5) ----
 * One page of a compressed fetch as the daemon stores it: a self-describing
 * codec buffer (core/codec/codec.h), its codec and calibration fingerprint.
 * The library allocates `codec` and `data`. */
typedef struct kvh_compressed_page {
  uint64_t handle;
  int32_t tier; /* KVH_TIER_*: where the daemon read it from */
  char* codec;
  uint64_t calibration_fingerprint; /* 0 = none */
  uint8_t* data;
  size_t size;
} kvh_compressed_page;
/* The codec buffers of `source`, undecoded (checksums verified). On success
 * `*pages` is an array of `*num_pages` pages owned by the library: free it
 * with kvh_compressed_pages_free. */
KVH_API int kvh_fetch_compressed(kvh_client* client, const char* ns,
                                 const kvh_fetch_source* source,
                                 kvh_compressed_page** pages, size_t* num_pages,
                                 int64_t timeout_ms);
KVH_API void kvh_compressed_pages_free(kvh_compressed_page* pages,
                                       size_t num_pages);
/* Decodes one page of kvh_fetch_compressed of namespace `ns` into raw page
 * bytes at dst (dst_capacity must hold a page: INVALID_ARGUMENT naming
 * "dst" otherwise); writes the page size to `written` (may be NULL). The
 * calibration is fetched once per client and fingerprint. */
KVH_API int kvh_decode_page(kvh_client* client, const char* ns,
                            const kvh_compressed_page* page, void* dst,
                            size_t dst_capacity, uint64_t* written,
                            int64_t timeout_ms);

/* What kvh_fetch_transformed wrote: ONE KV sequence of output_tokens tokens
 * made from the input_tokens tokens of the pages, in the namespace's dtype,
 * laid out [2 (K then V)][layer][token][kv_head][head_dim] whatever the page
 * layout. */
typedef struct kvh_transform_result {
  uint64_t input_tokens;
  uint64_t output_tokens;
  uint64_t bytes_written;
} kvh_transform_result;
/* The pages of `source` run through `transform` (KVH_TRANSFORM_KVCM) by the
 * daemon as one sequence: LOSSY and LENGTH-CHANGING. dst must hold the
 * result; the pages' raw size always suffices (INVALID_ARGUMENT naming
 * "dst" with the size needed otherwise). FAILED_PRECONDITION naming
 * "transform" for a namespace without kvcm_path. */
KVH_API int kvh_fetch_transformed(kvh_client* client, const char* ns,
                                  const kvh_fetch_source* source, int transform,
                                  void* dst, size_t dst_capacity,
                                  kvh_transform_result* out,
                                  int64_t timeout_ms);

/* ---- Same-host handles (ABI 5) ----
 * Where the pages of a lease of `ns` lie in the daemon's shared host arena
 * (same-host Fetch, docs/operations.md), as JSON: {"socket_path",
 * "daemon_id", "arena_bytes", "lease_expires_unix_ms", "pages": [{"handle",
 * "offset", "bytes", "checksum"}, ...]}. FAILED_PRECONDITION naming
 * "store.host_ipc_socket" when the daemon does not offer it. A RAW
 * kvh_fetch of a lease uses this path by itself; this is the raw call. */
KVH_API int kvh_get_host_handles(kvh_client* client, const char* ns,
                                 uint64_t lease_id, int64_t timeout_ms,
                                 char** handles_json);
/* Where the pages of a lease lie in the daemon's GPU arena (same-host zero
 * copy, docs/tiers.md), as JSON: {"ipc_handle" (hex of the 64-byte
 * cudaIpcMemHandle_t), "device", "device_uuid" (hex), "arena_bytes",
 * "lease_expires_unix_ms", "pages": [{"handle", "offset", "bytes"}, ...]}.
 * FAILED_PRECONDITION when the daemon has no device tier or does not allow
 * IPC. */
KVH_API int kvh_get_device_handles(kvh_client* client, const char* ns,
                                   uint64_t lease_id, int64_t timeout_ms,
                                   char** handles_json);
/* What the same-host Fetch path of this client did so far. */
typedef struct kvh_host_fetch_stats {
  uint64_t shm_fetches;         /* fetches served from shared memory */
  uint64_t shm_pages;           /* pages copied from shared memory */
  uint64_t fallbacks;           /* fetches that tried it, then streamed */
  uint64_t checksum_mismatches; /* copies that failed their checksum */
  uint64_t connects;            /* arena mappings made */
} kvh_host_fetch_stats;
KVH_API int kvh_get_host_fetch_stats(kvh_client* client,
                                     kvh_host_fetch_stats* out);

/* ---- The engine API (ABI 5; docs/engines_api.md) ----
 * Page-key namespaces, appends that send only the pages after a cached
 * prefix, layer-range fetches and layer-by-layer uploads. */
enum { KVH_KEY_TOKENS = 0, KVH_KEY_PAGE_KEYS = 1, KVH_KEY_PAGE_HASHES = 2 };
#define KVH_MAX_PAGE_KEY_BYTES 32

/* The elements of a sequence: `num_tokens` token ids (a token namespace),
 * or `num_keys` page keys, key i `key_lens[i]` (1..32) bytes at keys[i] (a
 * page-key namespace); give exactly one of the two (INVALID_ARGUMENT naming
 * "sequence" otherwise; the daemon refuses the other kind naming token_ids
 * or page_keys, and a key of another length naming page_keys[i]). Set
 * struct_size to sizeof(kvh_sequence). Read during the call only. */
typedef struct kvh_sequence {
  size_t struct_size;
  const int32_t* tokens;
  size_t num_tokens;
  const void* const* keys;
  const size_t* key_lens;
  size_t num_keys;
} kvh_sequence;

/* How an insert stores a sequence's pages (client::InsertOptions). Set
 * struct_size to sizeof(kvh_insert_options); NULL = all zero. */
typedef struct kvh_insert_options {
  size_t struct_size;
  /* Append: the first skip_pages pages are cached and not sent. The pages
   * given are either every page of the sequence (then those after the
   * skipped ones are sent, and all of them once more when the prefix is no
   * longer cached, unless no_retry) or only the new ones (then a prefix no
   * longer cached is FAILED_PRECONDITION naming "header.skip_pages" and
   * nothing is stored). */
  uint32_t skip_pages;
  /* Append after this lease (a prefix of the sequence): skip its pages.
   * With every page given, set skip_pages too (the lease's page count). */
  uint64_t prefix_lease_id;
  int no_retry; /* nonzero: never send the skipped pages */
} kvh_insert_options;

/* kvh_match_tiers for a sequence of either kind; matched_tokens counts
 * page_size tokens per page. `page_tiers` may be NULL. */
KVH_API int kvh_match_seq(kvh_client* client, const char* ns,
                          const kvh_sequence* seq, int lock,
                          int64_t lease_ttl_ms, uint64_t* handles,
                          int32_t* page_tiers, size_t handles_capacity,
                          kvh_match_result* out, int64_t timeout_ms);
/* kvh_insert / kvh_insert_pages for a sequence of either kind, with the
 * append options (`options` may be NULL). */
KVH_API int kvh_insert_seq(kvh_client* client, const char* ns,
                           const kvh_sequence* seq,
                           const kvh_insert_options* options, const void* pages,
                           size_t pages_len, uint64_t page_bytes,
                           kvh_insert_result* out, int64_t timeout_ms);
KVH_API int kvh_insert_seq_pages(kvh_client* client, const char* ns,
                                 const kvh_sequence* seq,
                                 const kvh_insert_options* options,
                                 const void* const* pages, size_t num_pages,
                                 uint64_t page_bytes, kvh_insert_result* out,
                                 int64_t timeout_ms);
/* kvh_fetch / kvh_fetch_pages (RAW) of layers [layer_begin, layer_end) of
 * each page only (0, 0 = all; else 0 <= begin < end <= num_layers,
 * INVALID_ARGUMENT naming "layer_begin" / "layer_end"): each page holds
 * those layers in the namespace's layout restricted to them, and
 * out->page_bytes is that size. */
KVH_API int kvh_fetch_layers(kvh_client* client, const char* ns,
                             const kvh_fetch_source* source,
                             uint32_t layer_begin, uint32_t layer_end,
                             void* dst, size_t dst_capacity,
                             kvh_fetch_result* out, int64_t timeout_ms);
KVH_API int kvh_fetch_pages_layers(kvh_client* client, const char* ns,
                                   const kvh_fetch_source* source,
                                   uint32_t layer_begin, uint32_t layer_end,
                                   void* const* page_dsts, size_t num_dsts,
                                   uint64_t page_capacity,
                                   kvh_fetch_result* out, int64_t timeout_ms);

/* A layer-by-layer upload (client::LayerUpload): one Insert held open while
 * an engine's prefill finishes layer after layer; the pages become visible
 * at kvh_upload_commit. kvh_begin_insert returns once the daemon accepted
 * the header (its errors, e.g. FAILED_PRECONDITION naming
 * "header.skip_pages", come from there); `timeout_ms` covers the whole
 * upload. options->no_retry does not apply. One thread drives an upload;
 * free it with kvh_upload_free (which aborts it unless committed) before
 * kvh_close of its client. */
typedef struct kvh_upload kvh_upload;
KVH_API int kvh_begin_insert(kvh_client* client, const char* ns,
                             const kvh_sequence* seq,
                             const kvh_insert_options* options,
                             int64_t timeout_ms, kvh_upload** out);
/* Layers of the namespace, pages whose layers are sent (the sequence's less
 * the skipped ones), bytes of one layer (sent_pages * 2 * page_size *
 * num_kv_heads * head_dim * dtype size) and the layer expected next. Any
 * out pointer may be NULL. */
KVH_API int kvh_upload_info(const kvh_upload* up, uint32_t* num_layers,
                            uint32_t* sent_pages, uint64_t* layer_bytes,
                            uint32_t* next_layer);
/* Layer `layer` (the next one: INVALID_ARGUMENT naming "layer" otherwise):
 * for each sent page, K then V of that layer, `len` == layer_bytes
 * (INVALID_ARGUMENT naming "layer_pages" otherwise); after those two errors
 * the upload stays open. Any other error ends it. */
KVH_API int kvh_upload_send_layer(kvh_upload* up, uint32_t layer,
                                  const void* data, size_t len);
/* The same from `num_pieces` pieces whose concatenation is the layer. */
KVH_API int kvh_upload_send_layer_pieces(kvh_upload* up, uint32_t layer,
                                         const void* const* pieces,
                                         const size_t* lens, size_t num_pieces);
/* The same gathered from blocks block_ids[i] (sent page i) of a host-memory
 * engine layout holding the layer (kvh_kv_layout, ABI 4); a GPU layout is
 * UNIMPLEMENTED naming "layout.device". */
KVH_API int kvh_upload_send_layer_from_layout(kvh_upload* up, uint32_t layer,
                                              const kvh_kv_layout* layout,
                                              const int64_t* block_ids,
                                              size_t num_blocks);
/* Makes the pages visible (INVALID_ARGUMENT naming "layer" while layers are
 * missing; the upload stays open). */
KVH_API int kvh_upload_commit(kvh_upload* up, kvh_insert_result* out);
/* Ends the upload with nothing stored (a no-op once it ended). */
KVH_API void kvh_upload_abort(kvh_upload* up);
/* Aborts unless committed and frees; NULL is ignored. */
KVH_API void kvh_upload_free(kvh_upload* up);

/* ---- Tiers (ABI 2) ----
 * Moves every unlocked page of `ns` down to `tier` (KVH_TIER_HOST_COMPRESSED
 * or KVH_TIER_DISK); `pages_moved` (may be NULL) says how many moved. */
KVH_API int kvh_demote(kvh_client* client, const char* ns, int tier,
                       uint64_t* pages_moved, int64_t timeout_ms);
/* The codec and calibration of `ns` (what decoding compressed pages needs);
 * on success `out` owns library memory: free it with kvh_calibration_free. */
KVH_API int kvh_get_calibration(kvh_client* client, const char* ns,
                                int64_t timeout_ms, kvh_calibration* out);
/* Frees what kvh_get_calibration put into `cal` and zeroes it; NULL and a
 * zeroed struct are ignored. */
KVH_API void kvh_calibration_free(kvh_calibration* cal);

/* ---- Calibrations (ABI 5; docs/calibration.md) ----
 * Any calibration `ns` still has, by fingerprint (0 = the active one): what
 * decoding pages encoded with an older calibration needs. NOT_FOUND naming
 * "calibration_fingerprint" for one it does not have. Free with
 * kvh_calibration_free. */
KVH_API int kvh_get_calibration_fp(kvh_client* client, const char* ns,
                                   uint64_t fingerprint, int64_t timeout_ms,
                                   kvh_calibration* out);
/* Makes `bytes` (canonical calibration bytes of the namespace's codec, as
 * kvh_get_calibration returns them) the active calibration, pinned at once
 * when `pin` is nonzero; writes its fingerprint (may be NULL).
 * INVALID_ARGUMENT naming "calibration" for bytes that do not parse or fit
 * the geometry; FAILED_PRECONDITION when the active one is pinned or the
 * codec takes no calibration. */
KVH_API int kvh_upload_calibration(kvh_client* client, const char* ns,
                                   const void* bytes, size_t num_bytes, int pin,
                                   uint64_t* fingerprint, int64_t timeout_ms);
/* The namespace's calibrations as JSON: [{"codec", "fingerprint", "source"
 * ("config", "uploaded" or "online"), "created_unix_ms", "active", "pinned",
 * "pages"}, ...], the active one first, then newest first. */
KVH_API int kvh_list_calibrations(kvh_client* client, const char* ns,
                                  int64_t timeout_ms, char** list_json);
/* Pins (pinned nonzero) or unpins the active calibration; `fingerprint`
 * must be the active one's (0 = whichever is active). A pinned calibration
 * is never replaced by online recalibration. */
KVH_API int kvh_pin_calibration(kvh_client* client, const char* ns,
                                uint64_t fingerprint, int pinned,
                                int64_t timeout_ms);

/* ---- Eviction ---- */
KVH_API int kvh_evict_pages(kvh_client* client, const char* ns,
                            const uint64_t* handles, size_t num_handles,
                            kvh_evict_result* out, int64_t timeout_ms);
KVH_API int kvh_evict_bytes(kvh_client* client, const char* ns, uint64_t bytes,
                            kvh_evict_result* out, int64_t timeout_ms);
KVH_API int kvh_evict_all(kvh_client* client, const char* ns,
                          kvh_evict_result* out, int64_t timeout_ms);

/* ---- Introspection ----
 * Stats as JSON: {"global": {...}, "namespaces": [{...}, ...]}; ns NULL or
 * "" = every namespace. A namespace's stats hold "tiers": [{"tier",
 * "name", "pages", "bytes"}, ...] (hottest first; bytes are page bytes for
 * raw, codec buffer bytes for the cold tiers), "demoted_pages",
 * "promoted_pages", "disk_write_errors" and "corrupt_dropped". */
KVH_API int kvh_stats(kvh_client* client, const char* ns, int64_t timeout_ms,
                      char** stats_json);
/* The radix tree as text (max_nodes 0 = the daemon's default). */
KVH_API int kvh_dump_tree(kvh_client* client, const char* ns,
                          uint32_t max_nodes, int64_t timeout_ms, char** text,
                          uint64_t* nodes);

/* ---- Cluster (ABI 5; include/kvharbor/cluster_client.h, docs/cluster.md) ----
 * Several daemons used as one cache: each prefix is owned by one member
 * (rendezvous hashing of the namespace and the prefix's first page), so
 * Match is one round trip to one daemon. A member that does not answer is
 * marked down for a while and its prefixes are MISSES meanwhile (Match
 * matches nothing, Insert reports `dropped`), never an error; errors that
 * are the caller's (bad input, unknown namespace) still are. Thread-safe
 * like kvh_client; kvh_cluster_close must not race with other calls. */
typedef struct kvh_cluster kvh_cluster;
/* How to find the members: exactly one of `members` (HOST:PORT, comma
 * separated), `dns` (NAME:PORT; every address it resolves to, re-resolved
 * every 5 s) or `etcd` (endpoints, comma separated; the daemons' own
 * registrations under etcd_prefix, NULL = "/kvharbor/members/").
 * Zero-initialize, set struct_size to sizeof(kvh_cluster_options). */
typedef struct kvh_cluster_options {
  size_t struct_size;
  const char* members;
  const char* dns;
  const char* etcd;
  const char* etcd_prefix;
  /* Longest a call to one member may take; 0 = 1000 ms. */
  int64_t member_timeout_ms;
  /* How long a failed member stays down; 0 = 2000 ms. */
  int64_t retry_down_after_ms;
  /* Every member's connection (deadline, TLS, token); may be NULL. */
  const kvh_connect_options* client;
} kvh_cluster_options;
KVH_API int kvh_cluster_connect(const kvh_cluster_options* options,
                                kvh_cluster** out);
KVH_API void kvh_cluster_close(kvh_cluster* cluster);
/* Creates the namespace (if it does not exist) on every live member and
 * again on members that join later. */
KVH_API int kvh_cluster_create_namespace(kvh_cluster* cluster,
                                         const kvh_namespace_spec* spec,
                                         int64_t timeout_ms);
/* The member owning the prefix `tokens` ("" without members or with less
 * than a page of tokens); free with kvh_string_free. */
KVH_API int kvh_cluster_owner(kvh_cluster* cluster, const char* ns,
                              const int32_t* tokens, size_t num_tokens,
                              int64_t timeout_ms, char** member);
/* Match on the owner, as kvh_match; `member` (free with kvh_string_free)
 * names the daemon that answered ("" when none did: a miss). Fetch and
 * release the lease through that member. */
KVH_API int kvh_cluster_match(kvh_cluster* cluster, const char* ns,
                              const int32_t* tokens, size_t num_tokens,
                              int lock, int64_t lease_ttl_ms, uint64_t* handles,
                              size_t handles_capacity, kvh_match_result* out,
                              char** member, int64_t timeout_ms);
/* The pages of a lease (lease_id) or of handles that `member` matched, page
 * i at dst + i * page_bytes (dst_capacity must hold them all). UNAVAILABLE
 * when that member went away in between. */
KVH_API int kvh_cluster_fetch(kvh_cluster* cluster, const char* ns,
                              const char* member,
                              const kvh_fetch_source* source, void* dst,
                              size_t dst_capacity, kvh_fetch_result* out,
                              int64_t timeout_ms);
KVH_API int kvh_cluster_release(kvh_cluster* cluster, const char* member,
                                uint64_t lease_id, int64_t timeout_ms);
/* Match and fetch in one call; a member failing in between is a miss.
 * dst must hold the matched pages (size it for every whole page of
 * `tokens`): OUT_OF_RANGE naming "dst_capacity" otherwise. matched_tokens,
 * page_bytes and num_pages of `out` say what arrived. */
KVH_API int kvh_cluster_lookup(kvh_cluster* cluster, const char* ns,
                               const int32_t* tokens, size_t num_tokens,
                               void* dst, size_t dst_capacity,
                               kvh_match_result* out, char** member,
                               int64_t timeout_ms);
/* Stores the pages of `tokens` on the owner, as kvh_insert (page_bytes 0 =
 * look it up); `dropped` (may be NULL) is set to 1 when the owner was down
 * and nothing was stored. */
KVH_API int kvh_cluster_insert(kvh_cluster* cluster, const char* ns,
                               const int32_t* tokens, size_t num_tokens,
                               const void* pages, size_t pages_len,
                               uint64_t page_bytes, kvh_insert_result* out,
                               int* dropped, char** member, int64_t timeout_ms);
/* Every member as JSON: {"source", "members": [{"address", "epoch", "up",
 * "calls", "failures", "down_misses", "dropped_inserts", "stats" (the
 * daemon's stats JSON, or null with "stats_error" when it did not answer
 * or with_stats is 0)}, ...]}. */
KVH_API int kvh_cluster_status(kvh_cluster* cluster, int with_stats,
                               char** status_json);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVHARBOR_CAPI_KVHARBOR_C_H_ */
