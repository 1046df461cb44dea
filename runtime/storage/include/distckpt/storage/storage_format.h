// Which storage format a save writes or a load reads: the name of a
// registered format (distckpt/storage/format_registry.h) and, for a save, the
// knobs of that format's writer. Formats are not an enum: one added later is
// registered under its name and chosen as StorageFormat("its-name").
#pragma once

#include <memory>
#include <string>

namespace distckpt {

// The knobs of one format's writer. Each format declares its own, derived
// from this (SafetensorsWriteOptions in distckpt/storage/safetensors.h), and
// its writer takes them from the StorageFormat it is given.
struct FormatOptions {
  virtual ~FormatOptions() = default;
};

class StorageFormat {
 public:
  // Loads: decided from what the location holds (detect_storage_format).
  StorageFormat() = default;
  // A registered format by name, e.g. "safetensors", with its writer's knobs
  // (none: its defaults).
  explicit StorageFormat(std::string name, std::shared_ptr<const FormatOptions> options = nullptr);

  // The built-in formats.
  static StorageFormat detected() { return {}; }
  static StorageFormat distckpt() { return StorageFormat("distckpt"); }
  static StorageFormat safetensors() { return StorageFormat("safetensors"); }
  static StorageFormat torch() { return StorageFormat("torch"); }

  // "distckpt", "safetensors", ...; "auto" for detected().
  const std::string& name() const { return name_; }
  bool is_detected() const { return name_ == "auto"; }
  // The knobs, when they are of the kind `Options` (nullptr otherwise).
  template <typename Options>
  const Options* options_as() const {
    return dynamic_cast<const Options*>(options_.get());
  }
  const FormatOptions* options() const { return options_.get(); }

  // The same format (whatever the knobs).
  friend bool operator==(const StorageFormat& a, const StorageFormat& b) { return a.name_ == b.name_; }
  friend bool operator!=(const StorageFormat& a, const StorageFormat& b) { return !(a == b); }

 private:
  std::string name_ = "auto";
  std::shared_ptr<const FormatOptions> options_;
};

}  // namespace distckpt
