// Copyright 2026 The kvblock Authors.
// SPDX-License-Identifier: Apache-2.0
#include "sim/trace.h"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvblock/status_macros.h"
#include "nlohmann/json.hpp"
#include "sim/random.h"

namespace kvblock::sim {
namespace {

using nlohmann::json;

// A JSON value for error messages: a scalar as it appears in the line
// (shortened), an array or object by its size. Never recursive: a line may
// nest arrays 100,000 deep, and dump() would recurse as deep.
std::string Quote(const json& value) {
  if (value.is_array()) {
    return absl::StrCat("an array of ", value.size(), " elements");
  }
  if (value.is_object()) {
    return absl::StrCat("an object of ", value.size(), " members");
  }
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMaxChars = 40;
  if (text.size() > kMaxChars) {
    // Cut at a character's first byte, not inside one.
    size_t cut = kMaxChars;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) {
      --cut;
    }
    text = text.substr(0, cut) + "...";
  }
  return text;
}

// An integer that fits int64; InvalidArgument naming `field` otherwise.
absl::StatusOr<int64_t> ReadInteger(const json& value,
                                    absl::string_view field) {
  if (!value.is_number_integer()) {
    // An integer past 64 bits is read as a float: it is absurd, not of the
    // wrong type.
    if (value.is_number_float() && std::abs(value.get<double>()) >= 0x1p63 &&
        std::isfinite(value.get<double>()) &&
        std::floor(value.get<double>()) == value.get<double>()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %s is absurd", field, Quote(value)));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected an integer, got %s", field, Quote(value)));
  }
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %s is absurd", field, Quote(value)));
  }
  return value.get<int64_t>();
}

// ReadInteger narrowed to int32 ("absurd" outside it).
absl::StatusOr<int32_t> ReadInt32(const json& value, absl::string_view field) {
  KVBLOCK_ASSIGN_OR_RETURN(const int64_t wide, ReadInteger(value, field));
  if (wide < std::numeric_limits<int32_t>::min() ||
      wide > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d is absurd", field, wide));
  }
  return static_cast<int32_t>(wide);
}

absl::StatusOr<std::string> ReadString(const json& value,
                                       absl::string_view field) {
  if (!value.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: expected a string, got %s", field, Quote(value)));
  }
  return value.get<std::string>();
}

// An array of token ids (each an int32; the sign is ValidateRequest's).
absl::StatusOr<std::vector<TokenId>> ReadTokens(const json& value,
                                                absl::string_view field) {
  if (!value.is_array()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected an array of token ids, got %s", field, Quote(value)));
  }
  std::vector<TokenId> tokens;
  tokens.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const json& token = value[i];
    // The common case (JSON parses a non-negative integer as unsigned)
    // without building the element's name.
    if (token.is_number_unsigned() &&
        token.get<uint64_t>() <=
            static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      tokens.push_back(static_cast<TokenId>(token.get<uint64_t>()));
      continue;
    }
    KVBLOCK_ASSIGN_OR_RETURN(
        const int32_t id, ReadInt32(token, absl::StrCat(field, "[", i, "]")));
    tokens.push_back(id);
  }
  return tokens;
}

// The member `field` of `object`, or InvalidArgument "FIELD: missing".
absl::StatusOr<const json*> Required(const json& object, const char* field) {
  const auto it = object.find(field);
  if (it == object.end()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": missing"));
  }
  return &*it;
}

// The member `field` of `object`, or null when absent.
const json* Optional(const json& object, const char* field) {
  const auto it = object.find(field);
  return it == object.end() ? nullptr : &*it;
}

// One line's request, typed but not yet checked against the limits.
absl::StatusOr<Request> ReadRequest(const json& object) {
  Request request;
  KVBLOCK_ASSIGN_OR_RETURN(const json* id, Required(object, "id"));
  KVBLOCK_ASSIGN_OR_RETURN(request.id, ReadString(*id, "id"));
  KVBLOCK_ASSIGN_OR_RETURN(const json* prompt, Required(object, "prompt"));
  KVBLOCK_ASSIGN_OR_RETURN(request.prompt, ReadTokens(*prompt, "prompt"));
  KVBLOCK_ASSIGN_OR_RETURN(const json* max_tokens,
                           Required(object, "max_tokens"));
  KVBLOCK_ASSIGN_OR_RETURN(request.max_tokens,
                           ReadInteger(*max_tokens, "max_tokens"));
  if (const json* arrival = Optional(object, "arrival")) {
    KVBLOCK_ASSIGN_OR_RETURN(request.arrival, ReadInteger(*arrival, "arrival"));
  }
  if (const json* n = Optional(object, "n")) {
    KVBLOCK_ASSIGN_OR_RETURN(request.n, ReadInt32(*n, "n"));
  }
  if (const json* beam = Optional(object, "beam")) {
    KVBLOCK_ASSIGN_OR_RETURN(request.beam, ReadInt32(*beam, "beam"));
  }
  if (const json* output = Optional(object, "output")) {
    KVBLOCK_ASSIGN_OR_RETURN(request.output, ReadTokens(*output, "output"));
  }
  if (const json* salt = Optional(object, "cache_salt")) {
    KVBLOCK_ASSIGN_OR_RETURN(request.cache_salt,
                             ReadString(*salt, "cache_salt"));
  }
  return request;
}

// InvalidArgument naming the first negative token of `tokens`.
absl::Status CheckTokens(absl::Span<const TokenId> tokens,
                         absl::string_view field) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s[%d]: token %d is negative", field, i, tokens[i]));
    }
  }
  return absl::OkStatus();
}

// InvalidArgument unless `value` (named `field`) is in [1, max_samples].
absl::Status CheckSamples(int32_t value, absl::string_view field,
                          int32_t max_samples) {
  if (value < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %d is less than 1", field, value));
  }
  if (value > max_samples) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d exceeds the batch of %d sequences", field, value, max_samples));
  }
  return absl::OkStatus();
}

}  // namespace

TokenId GeneratedToken(const Request& request, int32_t sample,
                       int64_t position) {
  if (sample == 0 && position < static_cast<int64_t>(request.output.size())) {
    return request.output[position];
  }
  const uint64_t hash =
      Mix(Mix(HashId(request.id) ^ static_cast<uint64_t>(sample)) ^
          static_cast<uint64_t>(position));
  return static_cast<TokenId>(hash % kGeneratedVocab);
}

absl::Status ValidateRequest(const Request& request,
                             const TraceLimits& limits) {
  if (request.id.empty()) {
    return absl::InvalidArgumentError("id: must not be empty");
  }
  if (request.arrival < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("arrival: %d is negative", request.arrival));
  }
  if (request.arrival > kMaxArrival) {
    return absl::InvalidArgumentError(
        absl::StrFormat("arrival: %d is absurd (more than %d steps)",
                        request.arrival, kMaxArrival));
  }
  if (request.prompt.empty()) {
    return absl::InvalidArgumentError("prompt: must not be empty");
  }
  KVBLOCK_RETURN_IF_ERROR(CheckTokens(request.prompt, "prompt"));
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens: %d is less than 1", request.max_tokens));
  }
  const int64_t prompt_tokens = static_cast<int64_t>(request.prompt.size());
  if (prompt_tokens > limits.max_tokens_per_seq) {
    return absl::InvalidArgumentError(
        absl::StrFormat("prompt: %d tokens exceed the %d tokens of a sequence "
                        "(max_pages_per_seq x page_size)",
                        prompt_tokens, limits.max_tokens_per_seq));
  }
  if (request.max_tokens > limits.max_tokens_per_seq - prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "max_tokens: %d after a prompt of %d tokens exceeds the %d tokens of "
        "a sequence (max_pages_per_seq x page_size)",
        request.max_tokens, prompt_tokens, limits.max_tokens_per_seq));
  }
  KVBLOCK_RETURN_IF_ERROR(CheckSamples(request.n, "n", limits.max_samples));
  KVBLOCK_RETURN_IF_ERROR(
      CheckSamples(request.beam, "beam", limits.max_samples));
  if (request.beam > 1 && request.n > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "beam: width %d with n %d; beam search and parallel samples are "
        "exclusive",
        request.beam, request.n));
  }
  if (static_cast<int64_t>(request.output.size()) > request.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("output: %d tokens exceed max_tokens %d",
                        request.output.size(), request.max_tokens));
  }
  return CheckTokens(request.output, "output");
}

absl::Status ValidateRequests(absl::Span<const Request> requests,
                              const TraceLimits& limits) {
  absl::flat_hash_map<absl::string_view, size_t> index_of;
  index_of.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& request = requests[i];
    if (absl::Status status = ValidateRequest(request, limits); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request '%s' (#%d): %s", request.id, i, status.message()));
    }
    const auto [it, inserted] = index_of.emplace(request.id, i);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrFormat("request '%s' (#%d): id: duplicates request #%d",
                          request.id, i, it->second));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TraceLine> ParseTraceLine(absl::string_view line,
                                         const TraceLimits& limits,
                                         bool allow_run_until) {
  TraceLine parsed;
  if (line.find_first_not_of(" \t\r") == absl::string_view::npos) {
    return parsed;
  }
  // nlohmann keeps the last of a repeated member: a line that repeats one
  // says two things, and is refused.
  absl::flat_hash_set<std::string> members;
  std::string repeated;
  const json::parser_callback_t note_members = [&](int depth,
                                                   json::parse_event_t event,
                                                   json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && repeated.empty() &&
        !members.insert(parsed.get_ref<const std::string&>()).second) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  json object;
  try {
    object = json::parse(line.begin(), line.end(), note_members);
  } catch (const json::parse_error& error) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad JSON at byte ", error.byte));
  } catch (const json::exception& error) {
    // A number no double holds (1e400) is out_of_range, not a parse error.
    return absl::InvalidArgumentError(absl::StrCat("bad JSON: ", error.what()));
  }
  if (!repeated.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Quote(json(repeated)), ": the member is repeated"));
  }
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a JSON object, got ", Quote(object)));
  }
  if (const json* run_until = Optional(object, "run_until");
      run_until != nullptr && allow_run_until) {
    if (object.size() != 1) {
      return absl::InvalidArgumentError(
          "run_until: a control line holds run_until alone");
    }
    KVBLOCK_ASSIGN_OR_RETURN(const int64_t step,
                             ReadInteger(*run_until, "run_until"));
    if (step < 0 || step > kMaxArrival) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "run_until: %d is outside [0, %d]", step, kMaxArrival));
    }
    parsed.run_until = step;
    return parsed;
  }
  KVBLOCK_ASSIGN_OR_RETURN(Request request, ReadRequest(object));
  KVBLOCK_RETURN_IF_ERROR(ValidateRequest(request, limits));
  parsed.request = std::move(request);
  return parsed;
}

absl::StatusOr<std::vector<Request>> ParseTrace(std::istream& in,
                                                const TraceLimits& limits) {
  std::vector<Request> requests;
  absl::flat_hash_map<std::string, int64_t> line_of_id;
  std::string line;
  for (int64_t line_number = 1; std::getline(in, line); ++line_number) {
    const auto error = [line_number](absl::string_view message) {
      return absl::InvalidArgumentError(
          absl::StrFormat("line %d: %s", line_number, message));
    };
    absl::StatusOr<TraceLine> parsed =
        ParseTraceLine(line, limits, /*allow_run_until=*/false);
    if (!parsed.ok()) return error(parsed.status().message());
    if (!parsed->request.has_value()) continue;
    Request& request = *parsed->request;
    const auto [it, inserted] = line_of_id.emplace(request.id, line_number);
    if (!inserted) {
      return error(absl::StrFormat("id: \"%s\" duplicates line %d", request.id,
                                   it->second));
    }
    requests.push_back(std::move(request));
  }
  if (in.bad()) return absl::InternalError("trace: read failed");
  return requests;
}

absl::StatusOr<std::vector<Request>> ReadTraceFile(absl::string_view path,
                                                   const TraceLimits& limits) {
  // A directory opens, then fails the first read: not a trace file either.
  std::error_code error;
  if (std::filesystem::is_directory(std::string(path), error)) {
    return absl::NotFoundError(
        absl::StrCat("cannot open trace file '", path, "': it is a directory"));
  }
  std::ifstream in{std::string(path)};
  if (!in) {
    // ifstream sets errno on Linux (it opens with fopen's open).
    return absl::NotFoundError(absl::StrCat("cannot open trace file '", path,
                                            "': ", std::strerror(errno)));
  }
  absl::StatusOr<std::vector<Request>> requests = ParseTrace(in, limits);
  if (!requests.ok()) {
    return absl::Status(requests.status().code(),
                        absl::StrCat(path, ": ", requests.status().message()));
  }
  return requests;
}

void WriteTrace(absl::Span<const Request> requests, std::ostream& out) {
  for (const Request& request : requests) {
    nlohmann::ordered_json line;
    line["id"] = request.id;
    line["arrival"] = request.arrival;
    line["prompt"] = request.prompt;
    line["max_tokens"] = request.max_tokens;
    if (request.n != 1) line["n"] = request.n;
    if (request.beam != 1) line["beam"] = request.beam;
    if (!request.output.empty()) line["output"] = request.output;
    if (!request.cache_salt.empty()) line["cache_salt"] = request.cache_salt;
    out << line.dump() << '\n';
  }
}

}  // namespace kvblock::sim
