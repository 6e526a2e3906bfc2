#include "src/config/choices.h"

namespace grass {

namespace {
constexpr ChoiceName<OptimizerKind> kOptimizerNames[] = {{OptimizerKind::AdamW, "adamw"},
                                                         {OptimizerKind::Grass, "grass"},
                                                         {OptimizerKind::GaLore, "galore"},
                                                         {OptimizerKind::Flora, "flora"}};
constexpr ChoiceName<Selection> kSelectionNames[] = {{Selection::TopR, "top_r"},
                                                     {Selection::Multinomial, "multinomial"},
                                                     {Selection::MultinomialNR, "multinomial_nr"},
                                                     {Selection::Uniform, "uniform"},
                                                     {Selection::UniformNR, "uniform_nr"}};
constexpr ChoiceName<SelectDim> kSelectDimNames[] = {
    {SelectDim::Auto, "auto"}, {SelectDim::Rows, "rows"}, {SelectDim::Cols, "cols"}};
constexpr ChoiceName<GaloreSvd> kGaloreSvdNames[] = {{GaloreSvd::Auto, "auto"},
                                                     {GaloreSvd::Exact, "exact"},
                                                     {GaloreSvd::Randomized, "randomized"}};
constexpr ChoiceName<GaloreSvdBatch> kGaloreSvdBatchNames[] = {{GaloreSvdBatch::None, "none"},
                                                               {GaloreSvdBatch::Layer, "layer"}};
constexpr ChoiceName<StateDtype> kStateDtypeNames[] = {{StateDtype::Auto, "auto"},
                                                      {StateDtype::Fp32, "fp32"},
                                                      {StateDtype::Bf16, "bf16"},
                                                      {StateDtype::Q8, "q8"}};
constexpr ChoiceName<StateBlocking> kStateBlockingNames[] = {{StateBlocking::Flat, "flat"},
                                                            {StateBlocking::Feature, "feature"}};
constexpr ChoiceName<ProjectionTarget> kTargetNames[] = {
    {ProjectionTarget::Q, "q"},       {ProjectionTarget::K, "k"},   {ProjectionTarget::V, "v"},
    {ProjectionTarget::O, "o"},       {ProjectionTarget::Gate, "gate"},
    {ProjectionTarget::Up, "up"},     {ProjectionTarget::Down, "down"}};
constexpr ChoiceName<PrecisionChoice> kPrecisionNames[] = {
    {PrecisionChoice::Auto, "auto"},
    {PrecisionChoice::F32, "fp32"},
    {PrecisionChoice::Bf16Mixed, "bf16-mixed"},
    {PrecisionChoice::Bf16, "bf16"}};
constexpr ChoiceName<DeviceChoice> kDeviceNames[] = {
    {DeviceChoice::Auto, "auto"}, {DeviceChoice::Cpu, "cpu"}, {DeviceChoice::Cuda, "cuda"}};
constexpr ChoiceName<Checkpointing> kCheckpointingNames[] = {
    {Checkpointing::None, "none"}, {Checkpointing::Elementwise, "elementwise"}, {Checkpointing::Layer, "layer"}};
constexpr ChoiceName<ActivationSample> kActivationSampleNames[] = {
    {ActivationSample::None, "none"},
    {ActivationSample::Crs, "crs"},
    {ActivationSample::WtaCrs, "wta-crs"},
    {ActivationSample::Bernoulli, "bernoulli"}};
constexpr ChoiceName<ActivationOffload> kActivationOffloadNames[] = {
    {ActivationOffload::None, "none"}, {ActivationOffload::Host, "host"}, {ActivationOffload::Disk, "disk"}};
constexpr ChoiceName<Switch> kSwitchNames[] = {
    {Switch::Auto, "auto"}, {Switch::On, "on"}, {Switch::Off, "off"}};
constexpr ChoiceName<AttentionChoice> kAttentionNames[] = {{AttentionChoice::Auto, "auto"},
                                                           {AttentionChoice::Grass, "grass"},
                                                           {AttentionChoice::Cudnn, "cudnn"},
                                                           {AttentionChoice::Mma, "mma"}};
constexpr ChoiceName<ScheduleKind> kScheduleNames[] = {{ScheduleKind::Cosine, "cosine"},
                                                       {ScheduleKind::Constant, "constant"}};
}  // namespace

template <>
std::span<const ChoiceName<OptimizerKind>> choice_names() { return kOptimizerNames; }
template <>
std::span<const ChoiceName<Selection>> choice_names() { return kSelectionNames; }
template <>
std::span<const ChoiceName<SelectDim>> choice_names() { return kSelectDimNames; }
template <>
std::span<const ChoiceName<GaloreSvd>> choice_names() { return kGaloreSvdNames; }
template <>
std::span<const ChoiceName<GaloreSvdBatch>> choice_names() { return kGaloreSvdBatchNames; }
template <>
std::span<const ChoiceName<StateDtype>> choice_names() { return kStateDtypeNames; }
template <>
std::span<const ChoiceName<StateBlocking>> choice_names() { return kStateBlockingNames; }
template <>
std::span<const ChoiceName<ProjectionTarget>> choice_names() { return kTargetNames; }
template <>
std::span<const ChoiceName<PrecisionChoice>> choice_names() { return kPrecisionNames; }
template <>
std::span<const ChoiceName<DeviceChoice>> choice_names() { return kDeviceNames; }
template <>
std::span<const ChoiceName<Checkpointing>> choice_names() { return kCheckpointingNames; }
template <>
std::span<const ChoiceName<ActivationSample>> choice_names() { return kActivationSampleNames; }
template <>
std::span<const ChoiceName<ActivationOffload>> choice_names() { return kActivationOffloadNames; }
template <>
std::span<const ChoiceName<Switch>> choice_names() { return kSwitchNames; }
template <>
std::span<const ChoiceName<AttentionChoice>> choice_names() { return kAttentionNames; }
template <>
std::span<const ChoiceName<ScheduleKind>> choice_names() { return kScheduleNames; }

}  // namespace grass
