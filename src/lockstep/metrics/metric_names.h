// Metric naming schemes: lockstep's own names, or verl's for the metrics
// that have a verl equivalent ([log] metric_names = "verl"), so dashboards
// built for verl runs read lockstep runs. docs/rl.md holds the table.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lockstep::metrics {

enum class MetricNames { Lockstep, Verl };

// "lockstep" | "verl"; throws Error naming the value otherwise.
MetricNames parse_metric_names(const std::string& s);
const char* to_string(MetricNames n);

// (lockstep name, verl name) for every metric with a verl equivalent.
const std::vector<std::pair<std::string_view, std::string_view>>& verl_metric_names();

// The name `name` (a lockstep metric name) is written under.
std::string exported_name(const std::string& name, MetricNames names);

// The lockstep name of a metric written under either scheme (identity for
// names that are not a verl name in the table).
std::string lockstep_name(const std::string& name);

}  // namespace lockstep::metrics
