// Creates a container in Azurite, for the tests (unkai itself does not create Azure
// containers): AZURITE_BLOB_STORAGE_URL=http://127.0.0.1:PORT/devstoreaccount1 node azure-mkcontainer.js NAME
const { BlobServiceClient } = require("@azure/storage-blob");
const url = process.env.AZURITE_BLOB_STORAGE_URL || "http://127.0.0.1:10000/devstoreaccount1";
// Azurite's well-known development account.
const key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
const conn = `DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=${key};BlobEndpoint=${url};`;
BlobServiceClient.fromConnectionString(conn)
  .getContainerClient(process.argv[2])
  .createIfNotExists()
  .then(() => console.log(`container ${process.argv[2]} ready`))
  .catch((e) => { console.error(e.message); process.exit(1); });
