# gmux wire schema, protocol version 1 (see docs/protocol.md).
#
# Every frame on the wire carries exactly one message: a Request from the client (the ICD) or a
# Reply from the daemon. Object and event ids are 64-bit numbers chosen by the client, unique
# within its session; the daemon looks every id up in the session's own table and never trusts
# one. OpenCL status codes travel unchanged as Int32 (CL_SUCCESS = 0).
@0x9ef6e1203a087134;

$import "/capnp/c++.capnp".namespace("gmux::proto::wire");

enum ObjectKind {
  platform @0;
  device @1;
  context @2;
  queue @3;
  mem @4;
  program @5;
  kernel @6;
  event @7;
  sampler @8;
}

# ---- images and samplers (served where the backend supports images) ----

struct ImageDesc {
  type @0 :UInt32;           # cl_mem_object_type
  width @1 :UInt64;
  height @2 :UInt64;
  depth @3 :UInt64;
  arraySize @4 :UInt64;
  rowPitch @5 :UInt64;       # of the initial data; 0: tightly packed
  slicePitch @6 :UInt64;
  buffer @7 :UInt64;         # 1D image buffers: the buffer's mem id; 0: none
}

struct CreateImage {
  id @0 :UInt64;
  context @1 :UInt64;
  flags @2 :UInt64;
  channelOrder @3 :UInt32;
  channelDataType @4 :UInt32;
  desc @5 :ImageDesc;
  initialData @6 :UInt64;    # bulk token of the initial contents (laid out with desc's pitches)
}

struct CreateSampler {
  id @0 :UInt64;
  context @1 :UInt64;
  normalizedCoords @2 :Bool;
  addressingMode @3 :UInt32;
  filterMode @4 :UInt32;
}

struct ImageFormats {
  context @0 :UInt64;
  flags @1 :UInt64;
  imageType @2 :UInt32;      # answered as `info`: an array of cl_image_format
}

# Host-side layout of an image region: rowPitch/slicePitch 0 take the tight defaults. For 1D
# image arrays the slice pitch steps between array elements (as in OpenCL).
struct ReadImage {
  mem @0 :UInt64;
  origin @1 :List(UInt64);   # 3 entries
  region @2 :List(UInt64);
  rowPitch @3 :UInt64;
  slicePitch @4 :UInt64;
  shm @5 :Bool;              # as ReadBuffer.shm
}

struct WriteImage {
  mem @0 :UInt64;
  origin @1 :List(UInt64);
  region @2 :List(UInt64);
  rowPitch @3 :UInt64;
  slicePitch @4 :UInt64;
  bulk @5 :UInt64;
}

struct CopyImage {
  src @0 :UInt64;
  dst @1 :UInt64;
  srcOrigin @2 :List(UInt64);
  dstOrigin @3 :List(UInt64);
  region @4 :List(UInt64);
}

struct FillImage {
  mem @0 :UInt64;
  color @1 :Data;            # 16 bytes: float4, int4 or uint4 by the image's format
  origin @2 :List(UInt64);
  region @3 :List(UInt64);
}

struct CopyImageBuffer {     # image -> buffer or buffer -> image
  image @0 :UInt64;
  buffer @1 :UInt64;
  origin @2 :List(UInt64);   # in the image
  region @3 :List(UInt64);
  offset @4 :UInt64;         # in the buffer
}

struct Hello {
  protocolVersion @0 :UInt32;
  clientName @1 :Text;
  pid @2 :UInt32;
  token @3 :Text;          # TCP only: the tenant's token
  control @4 :Bool;        # a control connection (gmux status): served by gmuxd itself, no
                           # worker; only Stats may follow
  frameAgent @5 :Bool;     # a frame agent (libgmux-frame.so, Unix socket only): served by
                           # gmuxd's frame controller; only FrameReport may follow
  program @6 :Text;        # frame agent: the program's name (shown by `gmux status`)
  renderer @7 :Text;       # frame agent: GL_RENDERER of its context (picks the device's policy)
  # Local sessions: where the worker may copy straight between the client's memory and the
  # device (docs/protocol.md, "One copy per transfer"). `probe` is the address of 8 bytes
  # holding `probeCookie` in the client; the worker reads them from the peer's pid to learn
  # whether it may (same uid, the client dumpable, ptrace rules).
  probe @8 :UInt64;
  probeCookie @9 :UInt64;
  dataFrames @10 :Bool;    # the client reads a read's data as data frames (proto/frame.h)
}

struct DeviceSummary {
  index @0 :UInt32;        # the daemon's device index; the client's device id
  name @1 :Text;
  type @2 :UInt64;         # cl_device_type
}

struct HelloReply {
  protocolVersion @0 :UInt32;
  tenant @1 :Text;
  session @2 :UInt64;
  devices @3 :List(DeviceSummary);
  remoteCopy @4 :Bool;     # the worker read the probe: WriteBuffer/ReadBuffer may name `remote`
  bufferStorage @5 :Bool;  # the worker knows CreateBuffer's `storage` (buffers on shared memory)
  dataFrames @6 :Bool;     # the worker takes bulk data as data frames (proto/frame.h) and, when
                           # the hello offered it, sends a read's data so
  storageArenas @7 :Bool;  # the worker knows CreateBuffer's `storageArena` (small buffers)
  replyRing @8 :Bool;      # the worker knows `replyRing` (replies through shared memory)
  profiledWaits @9 :Bool;  # the worker knows `waitEventsProfiled`
  requestRing @10 :Bool;   # the worker knows `requestRing` (requests through shared memory)
}

struct GetInfo {
  kind @0 :ObjectKind;
  id @1 :UInt64;
  param @2 :UInt32;
  device @3 :UInt64;       # program build info, kernel work-group info
  argIndex @4 :UInt32;     # kernel arg info
  hasDevice @5 :Bool;
  subGroup @6 :Bool;       # kernel: clGetKernelSubGroupInfo, with `input` as its input value
  input @7 :Data;
}

struct CreateContext {
  id @0 :UInt64;
  devices @1 :List(UInt64);
}

struct CreateQueue {
  id @0 :UInt64;
  context @1 :UInt64;
  device @2 :UInt64;
  properties @3 :UInt64;   # cl_command_queue_properties
}

struct CreateBuffer {
  id @0 :UInt64;
  context @1 :UInt64;
  flags @2 :UInt64;        # cl_mem_flags; host-pointer flags are handled by the client
  size @3 :UInt64;
  initialData @4 :UInt64;  # bulk token holding the initial contents, 0 for none
  # The request carries a sealed memfd of at least `size` bytes, mapped by the client, holding
  # the initial contents when the flags say CL_MEM_COPY_HOST_PTR. Where every device of the
  # context shares host memory coherently, it becomes the buffer's storage (the reply's
  # `storage` says so) and the client copies blocking transfers to and from it itself;
  # otherwise the worker copies the initial contents from it and lets it go.
  storage @5 :Bool;
  # Small buffers (under 64 KiB) share the client's storage arenas instead of a memfd each:
  # with `storage`, a nonzero arena places the buffer at `storageOffset` (a multiple of 256) in
  # the client's arena of that number. The first request naming an arena the worker has not
  # taken carries the arena's memfd (sealed against shrinking, at most 64 MiB); later ones
  # carry none.
  storageArena @6 :UInt32;
  storageOffset @7 :UInt64;
}

struct CreateSubBuffer {
  id @0 :UInt64;
  parent @1 :UInt64;
  flags @2 :UInt64;
  origin @3 :UInt64;
  size @4 :UInt64;
}

struct CreateProgramWithSource {
  id @0 :UInt64;
  context @1 :UInt64;
  source @2 :Text;
}

struct CreateProgramWithIL {
  id @0 :UInt64;
  context @1 :UInt64;
  il @2 :Data;                # e.g. SPIR-V; its kernels always run whole (no source to scan)
}

struct CreateProgramWithBuiltInKernels {
  id @0 :UInt64;
  context @1 :UInt64;
  devices @2 :List(UInt64);
  kernelNames @3 :Text;       # semicolon-separated, as OpenCL gives them
}

struct SetSpecConstant {
  program @0 :UInt64;
  specId @1 :UInt32;
  value @2 :Data;
}

struct CreateProgramWithBinary {
  id @0 :UInt64;
  context @1 :UInt64;
  devices @2 :List(UInt64);
  binaries @3 :List(Data);
}

# A header the client read from one of its build's -I directories (src/icd/includes.h).
struct IncludeFile {
  dir @0 :UInt32;             # index of the -I directory, < includeDirs
  name @1 :Text;              # relative path below it, normalized (no "..", not absolute)
  data @2 :Data;
}

struct BuildProgram {
  program @0 :UInt64;
  devices @1 :List(UInt64);   # empty: every device of the program
  options @2 :Text;           # without the -I options, which includeDirs replaces
  includeDirs @3 :UInt32;     # the build's -I directories, in order; the worker recreates them
  includeFiles @4 :List(IncludeFile);
}

struct CompileProgram {
  program @0 :UInt64;
  devices @1 :List(UInt64);
  options @2 :Text;
  headers @3 :List(UInt64);
  headerNames @4 :List(Text);
  includeDirs @5 :UInt32;
  includeFiles @6 :List(IncludeFile);
}

struct LinkProgram {
  id @0 :UInt64;              # the new program
  context @1 :UInt64;
  devices @2 :List(UInt64);
  options @3 :Text;
  inputs @4 :List(UInt64);
}

struct CreateKernel {
  id @0 :UInt64;
  program @1 :UInt64;
  name @2 :Text;
}

struct KernelReply {
  numArgs @0 :UInt32;
  argAddressQualifiers @1 :List(UInt32);  # cl_kernel_arg_address_qualifier per argument, 0: unknown
  argValueSizes @2 :List(UInt32);  # the arg_size a by-value argument must have, 0: unknown or none
}

struct CreateUserEvent {
  id @0 :UInt64;
  context @1 :UInt64;
}

struct SetUserEventStatus {
  id @0 :UInt64;
  status @1 :Int32;
}

struct Release {
  kind @0 :ObjectKind;
  id @1 :UInt64;
}

# Bulk data travels ahead of the command that uses it: BulkBegin reserves `size` bytes under a
# client-chosen token (checked against the session's limit), BulkData fills them.
struct BulkBegin {
  token @0 :UInt64;
  size @1 :UInt64;
  shm @2 :Bool;      # local clients: the data is in a sealed memfd passed with this frame
  # The write this data is for, when it is a plain buffer write (inline data only): the worker
  # may receive the data straight into the buffer (docs/protocol.md, "Writes received in
  # place"). The client sends nothing else between this frame and that write's command.
  destMem @3 :UInt64;
  destOffset @4 :UInt64;
}

struct BulkData {
  token @0 :UInt64;
  offset @1 :UInt64;
  data @2 :Data;
}

struct KernelArg {
  union {
    unset @0 :Void;
    value @1 :Data;        # by-value bytes
    mem @2 :UInt64;        # a buffer id
    nullMem @3 :Void;      # a NULL buffer argument
    local @4 :UInt64;      # __local bytes
    sampler @5 :UInt64;    # a sampler id
  }
}

struct NDRange {
  kernel @0 :UInt64;
  workDim @1 :UInt32;
  globalOffset @2 :List(UInt64);   # empty: zero
  globalSize @3 :List(UInt64);
  localSize @4 :List(UInt64);      # empty: chosen by the device
  args @5 :List(KernelArg);        # the kernel's arguments as set at enqueue time
}

struct Rect {
  bufferOrigin @0 :List(UInt64);   # 3 entries
  hostOrigin @1 :List(UInt64);
  region @2 :List(UInt64);
  bufferRowPitch @3 :UInt64;
  bufferSlicePitch @4 :UInt64;
  hostRowPitch @5 :UInt64;
  hostSlicePitch @6 :UInt64;
}

struct WriteBuffer {
  mem @0 :UInt64;
  offset @1 :UInt64;
  size @2 :UInt64;
  bulk @3 :UInt64;                 # token of the data (BulkBegin/BulkData sent before)
  rect @4 :Rect;                   # set for clEnqueueWriteBufferRect (the bulk holds the host region)
  isRect @5 :Bool;
  remote @6 :UInt64;               # nonzero (sessions with remoteCopy): no bulk; the worker
                                   # copies `size` bytes from this address of the client when the
                                   # write runs (a blocking write is answered then)
}

struct ReadBuffer {
  mem @0 :UInt64;
  offset @1 :UInt64;
  size @2 :UInt64;
  rect @3 :Rect;
  isRect @4 :Bool;
  shm @5 :Bool;      # local clients: write the data into the sealed memfd passed with this
                     # frame and answer with a plain status instead of ReadData
  remote @6 :UInt64; # nonzero (sessions with remoteCopy): the worker copies the data to this
                     # address of the client and answers with a plain status
}

struct CopyBuffer {
  src @0 :UInt64;
  dst @1 :UInt64;
  srcOffset @2 :UInt64;
  dstOffset @3 :UInt64;
  size @4 :UInt64;
  rect @5 :Rect;                   # hostOrigin = dst origin, host pitches = dst pitches
  isRect @6 :Bool;
}

struct FillBuffer {
  mem @0 :UInt64;
  pattern @1 :Data;
  offset @2 :UInt64;
  size @3 :UInt64;
}

struct Enqueue {
  queue @0 :UInt64;
  event @1 :UInt64;                # client-assigned id of this command's event (never 0)
  keepEvent @2 :Bool;              # the application holds the event: keep it in the table
  waitList @3 :List(UInt64);
  union {
    ndrange @4 :NDRange;
    writeBuffer @5 :WriteBuffer;
    readBuffer @6 :ReadBuffer;     # data returns in ReadData replies with this request's seq
    copyBuffer @7 :CopyBuffer;
    fillBuffer @8 :FillBuffer;
    marker @9 :Void;
    barrier @10 :Void;
    readImage @11 :ReadImage;      # data returns as for readBuffer
    writeImage @12 :WriteImage;
    copyImage @13 :CopyImage;
    fillImage @14 :FillImage;
    copyImageToBuffer @15 :CopyImageBuffer;
    copyBufferToImage @16 :CopyImageBuffer;
  }
  toldComplete @17 :Bool;          # a blocking write the client returned from once its data was
                                   # sent: every command of the session enqueued after it, on
                                   # any queue, runs after it (as natively after a blocking call)
}

struct Request {
  seq @0 :UInt64;                  # nonzero: the client waits for a Reply with this seq
  union {
    hello @1 :Hello;
    getInfo @2 :GetInfo;
    createContext @3 :CreateContext;
    createQueue @4 :CreateQueue;
    createBuffer @5 :CreateBuffer;
    createSubBuffer @6 :CreateSubBuffer;
    createProgramWithSource @7 :CreateProgramWithSource;
    createProgramWithBinary @8 :CreateProgramWithBinary;
    buildProgram @9 :BuildProgram;
    compileProgram @10 :CompileProgram;
    linkProgram @11 :LinkProgram;
    createKernel @12 :CreateKernel;
    createUserEvent @13 :CreateUserEvent;
    setUserEventStatus @14 :SetUserEventStatus;
    release @15 :Release;
    bulkBegin @16 :BulkBegin;
    bulkData @17 :BulkData;
    enqueue @18 :Enqueue;
    finish @19 :UInt64;            # a queue id; answered when all its earlier commands are done
    waitEvents @20 :List(UInt64);  # answered when all are complete
    stats @21 :Void;               # daemon statistics (tests, `gmux status`)
    createImage @22 :CreateImage;
    createSampler @23 :CreateSampler;
    imageFormats @24 :ImageFormats;
    shmForget @25 :UInt64;         # the inode of a shared buffer the client destroyed: the
                                   # daemon drops its kept mapping (never answered)
    createProgramWithIL @26 :CreateProgramWithIL;
    createProgramWithBuiltInKernels @27 :CreateProgramWithBuiltInKernels;
    setSpecConstant @28 :SetSpecConstant;
    lease @29 :LeaseOp;            # control connections only: `gmux lease`
    frame @30 :FrameReport;        # frame agents only; seq != 0 asks for a FrameDecision
    frames @31 :FramesOp;          # control connections only: `gmux frames`
    admin @32 :AdminOp;            # control connections only: `gmux usage`, `gmux tenant`
    replyRing @33 :UInt64;         # local sessions: the capacity of the ring whose memfd comes
                                   # with the request; once answered (on the socket), every
                                   # later frame to the client goes through it
                                   # (docs/protocol.md, "Replies through shared memory")
    waitEventsProfiled @34 :List(UInt64);  # as waitEvents; a success's `info` carries each
                                   # event's profiling times (proto/event_profile.h), in order
    requestRing @35 :UInt64;       # local sessions: the capacity of the ring whose memfd comes
                                   # with the request; once answered, every later frame from
                                   # the client comes through it (docs/protocol.md, "Requests
                                   # through shared memory")
  }
}

# `gmux usage` and `gmux tenant` (docs/operations.md, "Usage ledger", "Tenants at run time"): a
# command and its arguments, a JSON object; answered with Reply.admin, a JSON object, or an
# error status and message.
struct AdminOp {
  command @0 :Text;                # "usage" or "tenant"
  args @1 :Text;                   # JSON object (see docs/protocol.md, "Admin requests")
}

# A frame agent's report at a frame boundary (docs/protocol.md, "Frame agents"). Times are the
# agent's CLOCK_MONOTONIC (the daemon's steady clock: agents are local).
struct FrameReport {
  frames @0 :UInt32;               # frames whose Present returned since the last report (>= 0)
  presentEndNs @1 :UInt64;         # when the last of them returned (0: none yet)
  presentNs @2 :UInt64;            # their Present execution times, summed
  cpuNs @3 :UInt64;                # seq != 0: this frame's CPU time, previous Present's return
                                   # to this swap call; the decision is for this frame
  processCpuNs @4 :UInt64;         # the process's CPU time (all threads) since the last report:
                                   # the device time of a software renderer (llvmpipe)
}

# `gmux frames` (docs/operations.md, "Frame-rate SLAs"); answered with Reply.frames, JSON.
struct FramesOp {
  action @0 :Text;                 # "list", "policy" or "target"
  policy @1 :Text;                 # policy: none, sa, fsa or esa
  renderer @2 :Text;               # policy: the device group (a GL_RENDERER); empty: all
  tenant @3 :Text;                 # target: the tenant
  fps @4 :Float64;                 # target: its FPS target (0: the criterion)
}

# gmuxd to a frame agent: the sleep before this frame's Present (a Reply to a FrameReport with
# seq != 0), or, unasked (seq 0), whether the agent is under control from now on.
struct FrameDecision {
  sleepNs @0 :UInt64;
  controlled @1 :Bool;             # a finite reference is in force: ask at every frame
  referenceFps @2 :Float64;        # the reference (0 when not controlled)
  commandFps @3 :Float64;          # the PI's command F (0 when not controlled)
}

# `gmux lease` (docs/operations.md, "Device pool"); answered with Reply.lease, a JSON object.
struct LeaseOp {
  action @0 :Text;                 # "acquire", "release" or "list"
  tenant @1 :Text;                 # acquire: the tenant (admins only; empty: the caller's own)
  lease @2 :UInt64;                # release: the lease's number (L<n>)
  forSeconds @3 :Float64;          # acquire: how long it is held (0: until released)
  device @4 :Int32 = -1;           # acquire: that pool device (gmuxd's index); -1: any
}

struct ReadData {
  offset @0 :UInt64;               # into the destination (host) region
  data @1 :Data;
  last @2 :Bool;                   # the read's final chunk: the read is complete
}

struct Stats {
  sessions @0 :UInt32;
  liveBackendObjects @1 :Int64;
  pendingCommands @2 :UInt64;
  bulkBytes @3 :UInt64;
  scheduler @4 :Text;              # JSON: devices, policies, per-tenant monitoring (`gmux status`)
  frames @5 :Text;                 # JSON: frame agents and SLA policies (`gmux status`)
}

struct Reply {
  seq @0 :UInt64;                  # the Request answered; 0: an asynchronous error report
  status @1 :Int32;                # OpenCL status code
  message @2 :Text;                # human-readable detail for errors
  union {
    none @3 :Void;
    hello @4 :HelloReply;
    info @5 :Data;
    kernel @6 :KernelReply;
    readData @7 :ReadData;
    binaryStatus @8 :List(Int32);
    stats @9 :Stats;
    lease @10 :Text;               # JSON: the LeaseOp's answer
    frame @11 :FrameDecision;
    frames @12 :Text;              # JSON: the FramesOp's answer
    admin @13 :Text;               # JSON: the AdminOp's answer
    storage @14 :Bool;             # CreateBuffer with storage: the memfd is the buffer's storage
                                   # (false: the devices do not work in place; `none` when
                                   # declined for the worker's memory limit)
  }
}
