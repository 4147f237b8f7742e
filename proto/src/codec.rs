//! The protobuf codec of every Mayfly service: prost's, except that a message that does not
//! decode is INVALID_ARGUMENT naming the field (prost's error says `Message.field: why`), with
//! the reason [`UNDECODABLE_MESSAGE`]. tonic's default reports it as INTERNAL, which Mayfly
//! reserves for storage failures.

use std::{collections::HashMap, fmt::Display, marker::PhantomData};

use prost::Message;
use tonic::{
    Code, Status,
    codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder},
};
use tonic_prost::{ProstCodec, ProstDecoder};
use tonic_types::{ErrorDetails, StatusExt};

use crate::ERROR_DOMAIN;

/// `ErrorInfo.reason` of a request message that does not decode as protobuf.
pub const UNDECODABLE_MESSAGE: &str = "UNDECODABLE_MESSAGE";

/// INVALID_ARGUMENT with the reason [`UNDECODABLE_MESSAGE`]: a request that does not decode,
/// `why` saying what (it must quote no input, or only a little of it).
pub fn undecodable(why: impl Display) -> Status {
    let details = ErrorDetails::with_error_info(
        UNDECODABLE_MESSAGE,
        ERROR_DOMAIN,
        HashMap::<String, String>::new(),
    );
    Status::with_error_details(
        Code::InvalidArgument,
        format!("the message does not decode: {why}"),
        details,
    )
}

/// [`ProstCodec`] with undecodable messages reported as INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct MayflyCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for MayflyCodec<T, U> {
    fn default() -> Self {
        MayflyCodec(PhantomData)
    }
}

impl<T, U> Codec for MayflyCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = MayflyEncoder<T>;
    type Decoder = MayflyDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        MayflyEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        MayflyDecoder(ProstCodec::<T, U>::default().decoder())
    }
}

/// Encodes with prost, into room reserved for the whole message first: prost writes into
/// whatever room there is, and the encoder's buffer, grown by doubling as it writes, would
/// copy a large message (a feed or query page) several times over.
#[derive(Debug, Clone)]
pub struct MayflyEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for MayflyEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode_raw(buf);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// Decodes with prost; a failure is INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct MayflyDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default> Decoder for MayflyDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // prost's message names the message and field ("QueryRequest.query: invalid string
        // value: data is not UTF-8 encoded"); it quotes no input.
        U::decode(buf).map(Some).map_err(undecodable)
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.0.buffer_settings()
    }
}
