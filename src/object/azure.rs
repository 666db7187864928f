//! `az://container[/prefix]`: Azure Blob Storage.
//!
//! Credentials from the standard variables: `AZURE_STORAGE_ACCOUNT_NAME` with
//! `AZURE_STORAGE_ACCOUNT_KEY` or `AZURE_STORAGE_SAS_KEY`, or a service principal / managed
//! identity. `?emulator=true` (or `AZURE_STORAGE_USE_EMULATOR=true`) talks to Azurite on
//! 127.0.0.1:10000 with its well-known account.

use std::collections::BTreeMap;

use object_store::azure::{MicrosoftAzure, MicrosoftAzureBuilder};

use super::Error;
use super::retry::Policy;
use super::s3::{client_options, retry_config};

pub fn build(
    container: &str,
    params: &BTreeMap<String, String>,
    policy: &Policy,
) -> Result<MicrosoftAzure, Error> {
    let mut b = MicrosoftAzureBuilder::from_env().with_container_name(container);
    if params.get("emulator").is_some_and(|v| v == "true") {
        b = b.with_use_emulator(true);
    }
    if let Some(a) = params.get("account") {
        b = b.with_account(a);
    }
    let emulator = params.get("emulator").is_some_and(|v| v == "true")
        || std::env::var("AZURE_STORAGE_USE_EMULATOR").is_ok_and(|v| v == "true");
    Ok(b.with_client_options(client_options(policy, emulator))
        .with_retry(retry_config(policy))
        .build()?)
}
