// Writes tests/data/fixtures/verl_small.parquet, the small file the C++ tests
// read, corrupt and load as a dataset (tests/data/parquet_test.cpp): five rows
// of a verl-style math dataset written by hyparquet-writer (SNAPPY, data page
// v2, dictionary-encoded data_source, 3-level LIST of message structs).
// Usage: node write_fixture.mjs OUT_FILE
import { parquetWriteFile } from 'hyparquet-writer'

const out = process.argv[2]
if (!out) throw new Error('usage: node write_fixture.mjs OUT_FILE')
const rows = []
for (let i = 0; i < 5; i++) {
  rows.push({
    data_source: 'openai/gsm8k',
    prompt: [
      { role: 'system', content: 'Answer with a number.' },
      { role: 'user', content: 'What is ' + i + ' + ' + (2 * i) + '?' },
    ],
    ability: 'math',
    reward_model: { ground_truth: String(3 * i), style: 'rule' },
    extra_info: { index: BigInt(i), split: i < 4 ? 'train' : 'test', score: i === 2 ? null : i + 0.5 },
  })
}
const optional = (name, type) => ({ name, type, repetition_type: 'OPTIONAL' })
const string = name => ({ ...optional(name, 'BYTE_ARRAY'), converted_type: 'UTF8' })
parquetWriteFile({
  filename: out,
  schema: [
    { name: 'schema', num_children: 5 },
    string('data_source'),
    { name: 'prompt', repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
    { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
    { name: 'element', repetition_type: 'OPTIONAL', num_children: 2 },
    string('role'),
    string('content'),
    string('ability'),
    { name: 'reward_model', repetition_type: 'OPTIONAL', num_children: 2 },
    string('ground_truth'),
    string('style'),
    { name: 'extra_info', repetition_type: 'OPTIONAL', num_children: 3 },
    optional('index', 'INT64'),
    string('split'),
    optional('score', 'DOUBLE'),
  ],
  columnData: Object.keys(rows[0]).map(k => ({
    name: k,
    data: rows.map(r => r[k]),
    ...(k === 'data_source' ? { encoding: 'RLE_DICTIONARY' } : {}),
  })),
  statistics: false,
})
