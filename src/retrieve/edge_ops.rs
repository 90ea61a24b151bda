//! Conversions between this crate's types and Qdrant Edge's request and point types.

use std::collections::HashMap;
use std::path::Path;

use qdrant_edge::external::serde_json;
use qdrant_edge::{
    EdgeShard, Fusion, JsonPath, NamedQuery, Payload, PayloadSelector, PayloadSelectorInclude,
    PointId, PointStructPersisted, Prefetch, QueryEnum, QueryRequest, ScoredPoint, ScoringQuery,
    SparseVector, VectorInternal, VectorPersisted, VectorStructPersisted, WithPayloadInterface,
    WithVector,
};

use super::filter;
use super::payload::ChunkPayload;
use super::select::{by_score, Selection};
use super::store::{prefetch_limit, ChunkPoint, StoreQuery, StoredChunk};
use super::{RetrieveError, DENSE_VECTOR, RRF_K, SPARSE_VECTOR};
use crate::chunk::Chunk;

/// The point id of a chunk id (chunk ids are UUIDs).
pub(super) fn point_id(chunk_id: &str) -> Result<PointId, RetrieveError> {
    uuid::Uuid::parse_str(chunk_id)
        .map(PointId::Uuid)
        .map_err(|_| RetrieveError::Config(format!("chunk id `{chunk_id}` is not a UUID")))
}

/// A payload selector returning only `fields`.
pub(super) fn payload_fields(fields: &[&str]) -> Result<WithPayloadInterface, RetrieveError> {
    let include = fields
        .iter()
        .map(|f| {
            f.parse::<JsonPath>()
                .map_err(|_| RetrieveError::Config(format!("bad payload path {f}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(WithPayloadInterface::Selector(PayloadSelector::Include(PayloadSelectorInclude { include })))
}

/// The stored point of a chunk. The dense vector is dropped when the collection has none.
pub(super) fn point(p: ChunkPoint, dense_ok: bool) -> Result<PointStructPersisted, RetrieveError> {
    let id = point_id(&p.payload.chunk_id)?;
    let mut vectors = std::collections::HashMap::new();
    let sparse = SparseVector { indices: p.sparse.indices, values: p.sparse.values };
    vectors.insert(SPARSE_VECTOR.to_owned(), VectorPersisted::from(VectorInternal::Sparse(sparse)));
    if let (Some(dense), true) = (p.dense, dense_ok) {
        vectors.insert(DENSE_VECTOR.to_owned(), VectorPersisted::Dense(dense));
    }
    let payload = match serde_json::to_value(&p.payload) {
        Ok(serde_json::Value::Object(map)) => Payload(map),
        Ok(_) => return Err(RetrieveError::Config("chunk payload is not a JSON object".into())),
        Err(e) => return Err(RetrieveError::Config(e.to_string())),
    };
    Ok(PointStructPersisted {
        id,
        vector: VectorStructPersisted::Named(vectors),
        payload: Some(payload),
    })
}

/// The Edge query: BM25 alone, or BM25 and dense fused by RRF; with each hit's payload or
/// without (ids and scores only).
pub(super) fn query_request(
    q: &StoreQuery,
    dense_ok: bool,
    with_payload: bool,
) -> Result<QueryRequest, RetrieveError> {
    let filter = filter::to_edge(&q.filter)?;
    let sparse =
        SparseVector { indices: q.sparse.indices.clone(), values: q.sparse.values.clone() };
    let sparse_q = ScoringQuery::Vector(QueryEnum::Nearest(NamedQuery::new(
        VectorInternal::Sparse(sparse),
        SPARSE_VECTOR,
    )));
    let (prefetches, query) = match (&q.dense, dense_ok) {
        (Some(dense), true) => {
            let dense_q = ScoringQuery::Vector(QueryEnum::Nearest(NamedQuery::new(
                VectorInternal::Dense(dense.clone()),
                DENSE_VECTOR,
            )));
            let pf = |query| Prefetch {
                prefetches: vec![],
                query: Some(query),
                limit: prefetch_limit(q.limit),
                params: None,
                filter: None,
                score_threshold: None,
            };
            (
                vec![pf(sparse_q), pf(dense_q)],
                ScoringQuery::Fusion(Fusion::Rrf { k: RRF_K, weights: None }),
            )
        }
        _ => (vec![], sparse_q),
    };
    Ok(QueryRequest {
        prefetches,
        query: Some(query),
        filter,
        score_threshold: None,
        limit: q.limit,
        offset: 0,
        params: None,
        with_vector: WithVector::Bool(false),
        with_payload: WithPayloadInterface::Bool(with_payload),
    })
}

/// Offers `hits` (scored without payloads) to `selection` best first, reading their payloads a
/// batch at a time: a payload is parsed JSON, most of a query's cost, and the store is asked
/// for spare hits (`select::fetch_limit`) that a selection rarely reaches. The first batch is
/// what the selection still wants; each further one (chunks were skipped over the budget) is
/// twice the last, so a budget that skips many costs a few reads, not one per hit. A point
/// deleted since it was scored (a re-index meanwhile) is skipped.
pub(super) fn fill_selection(
    shard: &EdgeShard,
    mut hits: Vec<ScoredPoint>,
    selection: &mut Selection,
    path: &Path,
) -> Result<(), RetrieveError> {
    by_score(&mut hits, |p| Some(p.score));
    let (mut rest, mut size) = (&hits[..], 0);
    while !rest.is_empty() && selection.wanted() > 0 {
        size = selection.wanted().max(size * 2).min(rest.len());
        let (batch, next) = rest.split_at(size);
        rest = next;
        let ids: Vec<PointId> = batch.iter().map(|p| p.id).collect();
        let records = shard
            .retrieve(&ids, Some(WithPayloadInterface::Bool(true)), None)
            .map_err(|e| RetrieveError::storage(path, e))?;
        let mut payloads: HashMap<PointId, Option<Payload>> =
            records.into_iter().map(|r| (r.id, r.payload)).collect();
        for hit in batch {
            let Some(payload) = payloads.remove(&hit.id) else { continue };
            if selection.offer(scored_chunk(payload, hit.score, path)?) {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// A scored point's payload as a retrieved chunk.
pub(super) fn scored_chunk(
    payload: Option<Payload>,
    score: f32,
    path: &Path,
) -> Result<Chunk, RetrieveError> {
    let map = payload.map(|p| p.0).unwrap_or_default();
    let payload: ChunkPayload = serde_json::from_value(serde_json::Value::Object(map))
        .map_err(|e| RetrieveError::storage(path, format!("point payload is not a chunk: {e}")))?;
    Ok(payload.into_chunk(Some(score)))
}

/// The `chunk_id` and `path` of a scrolled record, if present.
pub(super) fn stored_chunk(payload: Option<Payload>) -> Option<StoredChunk> {
    let map = payload?.0;
    Some(StoredChunk {
        chunk_id: map.get("chunk_id")?.as_str()?.to_owned(),
        path: map.get("path")?.as_str()?.to_owned(),
    })
}
