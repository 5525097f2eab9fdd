// Which JSON numbers the reference's JSON parser (serde_json 1.0.150 as built into safetensors 0.8,
// without the `float_roundtrip` feature) rejects as "number out of range".
//
// serde_json does not round decimal numbers correctly: it keeps at most the first u64's worth of
// significant digits, converts them to f64 and multiplies or divides by a table power of ten. So
// whether a number near the largest double overflows differs from what strtod says, in both
// directions (1.7976931348623158e308 is rejected although it rounds to DBL_MAX; some values just
// above DBL_MAX are accepted). A number that does not even fit the header's types is rejected
// anyway; this matters for numbers in unknown tensor fields, which the reference parses and then
// ignores. To accept exactly the same headers, we replay serde_json's arithmetic.
#pragma once

#include <string_view>

namespace peft {

// `token` is a number that is valid by the JSON grammar, as it appeared in the text (a decimal
// point written as any single non-digit character other than 'e'/'E' is accepted too, because the
// JSON lexer may have swapped it for the locale's). Returns false when serde_json would fail with
// "number out of range".
bool serde_json_number_in_range(std::string_view token) noexcept;

}  // namespace peft
