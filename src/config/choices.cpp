#include "config/choices.h"

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
constexpr ChoiceName<ProjectionTarget> kTargetNames[] = {
    {ProjectionTarget::Q, "q"},       {ProjectionTarget::K, "k"},   {ProjectionTarget::V, "v"},
    {ProjectionTarget::O, "o"},       {ProjectionTarget::Gate, "gate"},
    {ProjectionTarget::Up, "up"},     {ProjectionTarget::Down, "down"}};
constexpr ChoiceName<PrecisionChoice> kPrecisionNames[] = {
    {PrecisionChoice::Auto, "auto"},
    {PrecisionChoice::F32, "fp32"},
    {PrecisionChoice::Bf16Mixed, "bf16-mixed"},
    {PrecisionChoice::Bf16, "bf16"}};
}  // namespace

template <>
std::span<const ChoiceName<OptimizerKind>> choice_names() { return kOptimizerNames; }
template <>
std::span<const ChoiceName<Selection>> choice_names() { return kSelectionNames; }
template <>
std::span<const ChoiceName<SelectDim>> choice_names() { return kSelectDimNames; }
template <>
std::span<const ChoiceName<ProjectionTarget>> choice_names() { return kTargetNames; }
template <>
std::span<const ChoiceName<PrecisionChoice>> choice_names() { return kPrecisionNames; }

}  // namespace grass
