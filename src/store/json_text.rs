//! A value bound as PostgreSQL `json` (its text), for the columns kept as text rather than
//! `jsonb` (migration 0028). sqlx's own `Json` always binds `jsonb`, which the server parses
//! into its binary form even when the column it goes to is `json`.

use serde::Serialize;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo};
use sqlx::{Encode, Postgres, Type};

/// `json`'s OID, fixed in PostgreSQL's catalog (`pg_type.dat`).
const JSON_OID: Oid = Oid(114);

/// `T` serialised straight into the statement's parameter, as `json`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JsonText<T>(pub T);

impl<T> Type<Postgres> for JsonText<T> {
    fn type_info() -> PgTypeInfo {
        PgTypeInfo::with_oid(JSON_OID)
    }
}

impl<T: Serialize> Encode<'_, Postgres> for JsonText<T> {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        // `json`'s binary form is its text.
        serde_json::to_writer(&mut **buf, &self.0)?;
        Ok(IsNull::No)
    }
}
