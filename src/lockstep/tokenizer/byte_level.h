// The GPT-2 byte-to-unicode map that byte-level BPE vocabularies are written in,
// and the writer of a merge-free byte-level tokenizer for lockstep's tiny models.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::tokenizer {

// Code point that byte b is written as in a byte-level vocabulary: printable
// bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves, the other 68
// bytes take U+0100.. in byte order (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A).
uint32_t byte_to_unicode(uint8_t b);
// The byte a code point stands for, or -1 when it is not one of the 256.
int unicode_to_byte(uint32_t cp);
// UTF-8 of byte_to_unicode(b), for all 256 bytes.
const std::array<std::string, 256>& byte_level_alphabet();
// Maps every byte of `bytes` to its code point, appending UTF-8 to `out`.
void byte_level_encode(std::string_view bytes, std::string& out);
// Inverse of byte_level_encode; false (out unchanged) when some character is not
// in the alphabet (such tokens are decoded as their own UTF-8, as Hugging Face does).
bool byte_level_decode(std::string_view text, std::string& out);

// Writes `dir`/tokenizer.json and `dir`/tokenizer_config.json for a byte-level
// BPE without merges: ids 0..255 are the bytes, then one special token per
// entry of `special_tokens` (ids 256, 257, ...). The config carries a ChatML
// chat template; eos is <|im_end|> when present (else the last special), pad is
// <|endoftext|> when present (else eos); no BOS. Creates `dir` if needed.
// Both files load in Hugging Face `tokenizers`/`transformers` unchanged.
//
// With `vocab_size` larger than those ids, the ids after the specials up to
// vocab_size - 1 are filled with multi-character pieces of printable ASCII
// (every pair in order, then every triple, ...). No merge produces them, so
// encoding a text is unchanged (bytes only), but every id a model of that
// vocabulary samples decodes to text.
void write_byte_level_tokenizer(const std::filesystem::path& dir,
                                const std::vector<std::string>& special_tokens = {"<|endoftext|>",
                                                                                  "<|im_start|>",
                                                                                  "<|im_end|>"},
                                int64_t vocab_size = 0);

// The filler pieces of write_byte_level_tokenizer: the first `count` strings of
// printable ASCII (0x20..0x7E) of length 2, then 3, ..., each in lexicographic
// order of the characters' codes. Plain bytes, not the byte-level spelling.
std::vector<std::string> ascii_filler_pieces(int64_t count);

}  // namespace lockstep::tokenizer
