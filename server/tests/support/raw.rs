//! Requests as bytes, for what no protobuf library would encode.

use bytes::{Buf, BufMut};
use tonic::{
    Status,
    codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
    transport::Channel,
};

/// Sends bytes as they are, reads the reply's bytes: for requests no protobuf library would
/// encode.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// One unary call of `path` sending `body` as its message.
pub(crate) async fn raw_call(
    channel: &Channel,
    path: &'static str,
    body: Vec<u8>,
) -> Result<Vec<u8>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.expect("channel ready");
    grpc.unary(
        tonic::Request::new(body),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        RawCodec,
    )
    .await
    .map(tonic::Response::into_inner)
}

/// `n` as a protobuf varint.
pub(crate) fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// Field `tag` of wire type 2 (length-delimited) holding `inner`.
pub(crate) fn length_delimited(tag: u32, inner: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(inner.len() + 6);
    varint(u64::from(tag << 3 | 2), &mut out);
    varint(inner.len() as u64, &mut out);
    out.extend_from_slice(inner);
    out
}
