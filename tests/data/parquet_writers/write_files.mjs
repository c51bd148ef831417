// Writes parquet test files with two independent writers (hyparquet-writer,
// parquetjs) into the directory given as the first argument, and beside each
// NAME.parquet the rows it holds as NAME.jsonl (one JSON object per line, the
// form `lockstep data` must print). Covers flat columns of each physical type
// with nulls, a verl-like nested schema, dictionary and plain encodings, data
// pages v1 and v2, several row groups and pages, and every codec each writer
// offers here: hyparquet-writer UNCOMPRESSED, SNAPPY, GZIP (node's zlib) and
// ZSTD (node's zlib from node 22.15, else the Debian `zstd` program; skipped
// without either); parquetjs UNCOMPRESSED (v1 pages), SNAPPY and GZIP (v2 pages).
import fs from 'node:fs'
import path from 'node:path'
import zlib from 'node:zlib'
import { createRequire } from 'node:module'
import { execFileSync } from 'node:child_process'
import { parquetWriteFile } from 'hyparquet-writer'

const require = createRequire(import.meta.url)
const parquetjs = require('parquetjs')

const out = process.argv[2]
if (!out) throw new Error('usage: node write_files.mjs OUT_DIR')
fs.mkdirSync(out, { recursive: true })

// JSON with exact 64-bit integers (BigInt) and byte arrays as latin1 strings.
function toJson(v) {
  if (v === null || v === undefined) return 'null'
  if (typeof v === 'bigint') return v.toString()
  if (v instanceof Uint8Array) return JSON.stringify(Buffer.from(v).toString('latin1'))
  if (Array.isArray(v)) return '[' + v.map(toJson).join(',') + ']'
  if (typeof v === 'object') {
    return '{' + Object.keys(v).sort().map(k => JSON.stringify(k) + ':' + toJson(v[k])).join(',') + '}'
  }
  return JSON.stringify(v)
}

function writeExpected(name, rows) {
  fs.writeFileSync(path.join(out, name + '.jsonl'), rows.map(r => toJson(r) + '\n').join(''))
}

// ---- flat columns: every physical type, nulls, dictionary and plain ----
const N = 300
const flat = []
for (let i = 0; i < N; i++) {
  flat.push({
    b: i % 7 === 3 ? null : i % 3 === 0,
    i32: i % 11 === 5 ? null : (i * 7919) % 100000 - 50000,
    i64: i === 1 ? 4611686018427387905n : BigInt(i) * -1234567891n,
    f: [0.5, -1.25, 3.375, 1024.75][i % 4],
    d: i % 13 === 0 ? null : i + 0.125,
    s: i % 5 === 0 ? null : 'row ' + i + (i % 17 === 0 ? ' — ünïcode ✓' : ''),
    cat: ['math', 'code', 'chat'][i % 3],
    bin: new TextEncoder().encode('b' + (i % 4)),
    fixed: new TextEncoder().encode(String(100 + (i % 900)).slice(0, 3)),
  })
}
const flatSchema = [
  { name: 'root', num_children: 9 },
  { name: 'b', type: 'BOOLEAN', repetition_type: 'OPTIONAL' },
  { name: 'i32', type: 'INT32', repetition_type: 'OPTIONAL' },
  { name: 'i64', type: 'INT64', repetition_type: 'REQUIRED' },
  { name: 'f', type: 'FLOAT', repetition_type: 'REQUIRED' },
  { name: 'd', type: 'DOUBLE', repetition_type: 'OPTIONAL' },
  { name: 's', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'cat', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'REQUIRED' },
  { name: 'bin', type: 'BYTE_ARRAY', repetition_type: 'REQUIRED' },
  { name: 'fixed', type: 'FIXED_LEN_BYTE_ARRAY', type_length: 3, repetition_type: 'REQUIRED' },
]
const col = (name, encoding) => ({ name, data: flat.map(r => r[name]), ...(encoding ? { encoding } : {}) })

const compressors = { GZIP: b => new Uint8Array(zlib.gzipSync(b)) }
const codecs = ['UNCOMPRESSED', 'SNAPPY', 'GZIP']
function zstdProgram() {
  try {
    execFileSync('zstd', ['--version'], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
}
if (typeof zlib.zstdCompressSync === 'function') {
  compressors.ZSTD = b => new Uint8Array(zlib.zstdCompressSync(b))
  codecs.push('ZSTD')
} else if (zstdProgram()) {
  compressors.ZSTD = b => new Uint8Array(execFileSync('zstd', ['-q', '-c', '-3'], { input: b }))
  codecs.push('ZSTD')
}

for (const codec of codecs) {
  const name = 'hyparquet_flat_' + codec.toLowerCase()
  parquetWriteFile({
    filename: path.join(out, name + '.parquet'),
    schema: flatSchema,
    columnData: [
      col('b', 'RLE'), col('i32', 'PLAIN'), col('i64'), col('f'), col('d', 'PLAIN'),
      col('s', 'PLAIN'), col('cat', 'RLE_DICTIONARY'), col('bin', 'RLE_DICTIONARY'), col('fixed'),
    ],
    codec,
    compressors,
    rowGroupSize: 128,  // three row groups
    pageSize: 256,      // several pages per column chunk
  })
  writeExpected(name, flat)
}

// ---- verl-like nested schema ----
const verl = []
for (let i = 0; i < 60; i++) {
  const prompt = i % 10 === 4 ? [] : [
    { role: 'system', content: 'Think step by step.' },
    { role: 'user', content: 'What is ' + i + ' + ' + (i * 3) + '?' },
  ]
  if (i % 9 === 2) prompt.push({ role: 'assistant', content: null })
  verl.push({
    data_source: i % 2 ? 'openai/gsm8k' : 'lighteval/MATH',
    prompt,
    ability: 'math',
    reward_model: i % 15 === 7 ? null : { ground_truth: String(i * 4), style: 'rule' },
    extra_info: { index: BigInt(i), split: i < 50 ? 'train' : 'test' },
    tags: i % 6 === 1 ? null : Array.from({ length: i % 4 }, (_, k) => 'tag' + k),
    matrix: i % 5 === 0 ? [] : [[i, i + 1], [], [i * 2]],
    attrs: i % 7 === 3 ? null : Array.from({ length: i % 3 }, (_, j) => ({ key: 'k' + j, value: j === 1 ? null : i * j })),
  })
}
// A MAP's key/value entries are one JSON object.
const verlExpected = verl.map(r => ({
  ...r,
  attrs: r.attrs === null ? null : Object.fromEntries(r.attrs.map(e => [e.key, e.value])),
}))
const verlSchema = [
  { name: 'root', num_children: 8 },
  { name: 'data_source', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'prompt', repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  { name: 'element', repetition_type: 'OPTIONAL', num_children: 2 },
  { name: 'role', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'content', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'ability', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'reward_model', repetition_type: 'OPTIONAL', num_children: 2 },
  { name: 'ground_truth', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'style', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'extra_info', repetition_type: 'OPTIONAL', num_children: 2 },
  { name: 'index', type: 'INT64', repetition_type: 'OPTIONAL' },
  { name: 'split', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'OPTIONAL' },
  { name: 'tags', repetition_type: 'OPTIONAL', converted_type: 'LIST', num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  { name: 'element', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'REQUIRED' },
  { name: 'matrix', repetition_type: 'REQUIRED', converted_type: 'LIST', num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  { name: 'element', repetition_type: 'REQUIRED', converted_type: 'LIST', num_children: 1 },
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  { name: 'element', type: 'INT32', repetition_type: 'REQUIRED' },
  { name: 'attrs', repetition_type: 'OPTIONAL', converted_type: 'MAP', num_children: 1 },
  { name: 'key_value', repetition_type: 'REPEATED', num_children: 2 },
  { name: 'key', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'REQUIRED' },
  { name: 'value', type: 'INT64', repetition_type: 'OPTIONAL' },
]
for (const codec of codecs) {
  const name = 'hyparquet_verl_' + codec.toLowerCase()
  parquetWriteFile({
    filename: path.join(out, name + '.parquet'),
    schema: verlSchema,
    columnData: Object.keys(verl[0]).map(k => ({
      name: k,
      data: k === 'attrs' ? verl.map(r => r[k] && r[k].map(e => ({ ...e, value: e.value === null ? null : BigInt(e.value) })))
                          : verl.map(r => r[k]),
    })),
    codec,
    compressors,
    rowGroupSize: 25,
  })
  writeExpected(name, verlExpected)
}

// ---- chat prompts for `lockstep generate` (parquet and JSONL must give the same samples) ----
const chats = ['2+2=', 'hello', 'Name a prime.'].map((q, i) => ({
  messages: [...(i === 1 ? [{ role: 'system', content: 'Be brief.' }] : []), { role: 'user', content: q }],
}))
parquetWriteFile({
  filename: path.join(out, 'hyparquet_chat.parquet'),
  schema: [
    { name: 'root', num_children: 1 },
    { name: 'messages', repetition_type: 'REQUIRED', converted_type: 'LIST', num_children: 1 },
    { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
    { name: 'element', repetition_type: 'REQUIRED', num_children: 2 },
    { name: 'role', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'REQUIRED' },
    { name: 'content', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'REQUIRED' },
  ],
  columnData: [{ name: 'messages', data: chats.map(c => c.messages) }],
})
writeExpected('hyparquet_chat', chats)

// ---- an encoding lockstep does not read: NAME.error holds what the error names ----
parquetWriteFile({
  filename: path.join(out, 'hyparquet_delta.parquet'),
  columnData: [
    { name: 'id', data: flat.map((_, i) => i), type: 'INT32', encoding: 'DELTA_BINARY_PACKED' },
  ],
})
fs.writeFileSync(path.join(out, 'hyparquet_delta.error'), "column 'id' (row group 0): unsupported encoding DELTA_BINARY_PACKED\n")

// ---- parquetjs: data page v1 (uncompressed) and v2 (snappy, gzip) ----
// (Not its RLE booleans: parquetjs 0.11 encodes every one as false.)
const pjSchema = new parquetjs.ParquetSchema({
  name: { type: 'UTF8' },
  note: { type: 'UTF8', optional: true },
  flag: { type: 'BOOLEAN' },
  count: { type: 'INT32', optional: true },
  big: { type: 'INT64' },
  ratio: { type: 'FLOAT' },
  score: { type: 'DOUBLE', optional: true },
  raw: { type: 'BYTE_ARRAY' },
  messages: { repeated: true, fields: { role: { type: 'UTF8' }, content: { type: 'UTF8', optional: true } } },
  reward_model: { optional: true, fields: { ground_truth: { type: 'UTF8' }, style: { type: 'UTF8' } } },
  ids: { type: 'INT32', repeated: true },
})
const pjRows = []
for (let i = 0; i < 40; i++) {
  pjRows.push({
    name: 'item-' + i,
    note: i % 4 === 1 ? null : 'note ' + i,
    flag: i % 2 === 0,
    count: i % 6 === 0 ? null : i * 1000 - 7,
    big: i * 1000000007 - 3,
    ratio: [0.25, -8.5, 100.125][i % 3],
    score: i % 7 === 0 ? null : i / 8 + 0.0625,
    raw: Buffer.from('raw' + i),
    messages: i % 8 === 3 ? [] : [{ role: 'user', content: 'q' + i }, { role: 'assistant', content: i % 5 ? 'a' + i : null }],
    reward_model: i % 9 === 4 ? null : { ground_truth: String(i), style: 'rule' },
    ids: Array.from({ length: i % 5 }, (_, k) => i * 10 + k),
  })
}
// parquetjs leaves an absent optional field out of a nested object (the
// reader gives null); a repeated field with no items is an empty array.
function pjExpected(r) {
  return {
    ...r,
    raw: r.raw.toString('latin1'),
    messages: r.messages.map(m => ({ role: m.role, content: m.content })),
  }
}
async function writeParquetjs(name, compression, useDataPageV2) {
  const fields = {}
  for (const [k, f] of Object.entries(pjSchema.schema)) fields[k] = { ...f, compression }
  const schema = new parquetjs.ParquetSchema(fields)
  const w = await parquetjs.ParquetWriter.openFile(schema, path.join(out, name + '.parquet'), { useDataPageV2 })
  w.setRowGroupSize(16)  // three row groups
  for (const r of pjRows) {
    const row = { ...r }
    for (const k of Object.keys(row)) if (row[k] === null) delete row[k]
    row.messages = row.messages.map(m => (m.content === null ? { role: m.role } : m))
    await w.appendRow(row)
  }
  await w.close()
  writeExpected(name, pjRows.map(pjExpected))
}
await writeParquetjs('parquetjs_v1_uncompressed', 'UNCOMPRESSED', false)
await writeParquetjs('parquetjs_v2_snappy', 'SNAPPY', true)
await writeParquetjs('parquetjs_v2_gzip', 'GZIP', true)
console.log('wrote ' + fs.readdirSync(out).filter(f => f.endsWith('.parquet')).length + ' parquet files; codecs ' +
            codecs.join(' '))
